// Which HTTP/1.1 server takes the proxy port (docs/decisions/http-front-door.md, issue 15).
import type { Config } from '../config/schema.js';
import { dataplaneThreadCount } from './threads/host.js';

export type ProxyHttpParser = 'uws' | 'node';

/**
 * 'auto' is node:http (llhttp), which answers pipelined, HTTP/1.0 and malformed requests as RFC 9112 asks, when one
 * data plane thread serves the proxy port. Several threads are a throughput setup, and node:http on Node 20 cannot
 * share one port between them (no SO_REUSEPORT before Node 22.12): they get uWebSockets.js, and the start-up log
 * says what that gives up.
 */
export function proxyHttpParser(config: Pick<Config, 'proxyHttpParser' | 'dataplaneThreads'>): ProxyHttpParser {
  if (config.proxyHttpParser !== 'auto') return config.proxyHttpParser;
  return dataplaneThreadCount(config) > 1 ? 'uws' : 'node';
}

/** What the uWS listener does not answer, for the start-up log of an operator who runs it. */
export const UWS_LIMITS = 'uWebSockets.js 20.30 closes pipelined requests unanswered and does not answer HTTP/1.0 or malformed requests: put a strict HTTP proxy in front, or use proxyHttpParser=node';
