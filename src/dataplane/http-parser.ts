// Which HTTP/1.1 server takes the proxy port (docs/http-front-door.md, docs/runtime.md).
import type { Config } from '../config/schema.js';

export type ProxyHttpParser = 'uws' | 'node';

/**
 * node:http (llhttp) unless the operator asks for uWebSockets.js by name: 'auto' is node:http, with one thread
 * or several (Node 22.12+ shares one port between threads through SO_REUSEPORT), so no setting silently changes
 * the parser. 'uws' runs only where its native build loads (src/http/uws.ts refuses otherwise).
 */
export function proxyHttpParser(config: Pick<Config, 'proxyHttpParser'>): ProxyHttpParser {
  return config.proxyHttpParser === 'uws' ? 'uws' : 'node';
}

/** What the uWS listener does not answer, for the start-up log of an operator who runs it. */
export const UWS_LIMITS = 'uWebSockets.js 20.30 closes pipelined requests unanswered and does not answer HTTP/1.0 or malformed requests: put a strict HTTP proxy in front, or use proxyHttpParser=node';
