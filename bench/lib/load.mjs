// Runs autocannon against one endpoint and reduces its result to the figures the tables report.
import autocannon from 'autocannon';

/**
 * @param {{ name: string, url: string, urls?: string[], method?: string, headers?: Record<string,string>, body?: string,
 *           paths?: string[], setupRequest?: (req: object, ctx: object) => object, duration: number, connections: number }} spec
 */
export async function measure(spec) {
  let i = 0;
  const request = { method: spec.method ?? 'GET', headers: spec.headers ?? {}, body: spec.body };
  // With several paths, each request takes the next one, so a write spreads over every pool.
  if (spec.paths?.length) request.setupRequest = (req) => ({ ...req, path: spec.paths[i++ % spec.paths.length] });
  // A per-request hook of the caller (e.g. a fresh signature per request) runs after the path is chosen.
  if (spec.setupRequest) {
    const choosePath = request.setupRequest;
    request.setupRequest = (req, ctx) => spec.setupRequest(choosePath ? choosePath(req, ctx) : req, ctx);
  }
  const result = await autocannon({
    // Several URLs (one port per data plane thread): autocannon spreads the connections over them.
    url: spec.urls ?? spec.url,
    connections: spec.connections,
    duration: spec.duration,
    requests: [request],
  });
  const statuses = Object.fromEntries(Object.entries(result.statusCodeStats ?? {}).map(([code, s]) => [code, Number(s.count)]));
  return {
    name: spec.name,
    requests: result.requests.total,
    rps: round(result.requests.average),
    latency_ms: { mean: round(result.latency.average), p50: result.latency.p50, p99: result.latency.p99, max: result.latency.max },
    errors: result.errors,
    timeouts: result.timeouts,
    non2xx: result.non2xx,
    statuses,
    duration_s: result.duration,
    connections: result.connections,
  };
}

const round = (n) => Math.round(n * 10) / 10;
