// The dashboard as the control process serves it: one HTML shell for every page under /dashboard, the
// script and style built by esbuild into dist/dashboard (`npm run build`), and strict security headers.
// The pages do everything through the public Control API with the session cookie; nothing here reads
// or writes the store.
import { readdirSync, readFileSync } from 'node:fs';
import type { FastifyInstance, FastifyReply } from 'fastify';
import { fromRoot } from '../config/paths.js';

export const DASHBOARD_PATH = '/dashboard';

/** No inline script or style, nothing from elsewhere, never framed; the page's links and tokens never leak by Referer. */
export const DASHBOARD_CSP = [
  "default-src 'none'",
  "script-src 'self'",
  "style-src 'self'",
  "img-src 'self' data:",
  "font-src 'self'",
  "connect-src 'self'",
  "form-action 'self'",
  "base-uri 'none'",
  "frame-ancestors 'none'",
].join('; ');

const SECURITY_HEADERS: Record<string, string> = {
  'content-security-policy': DASHBOARD_CSP,
  'x-frame-options': 'DENY',
  'x-content-type-options': 'nosniff',
  'referrer-policy': 'no-referrer',
  'cross-origin-opener-policy': 'same-origin',
  'cross-origin-resource-policy': 'same-origin',
  'cache-control': 'no-store',
};

const TYPES: Record<string, string> = {
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.svg': 'image/svg+xml',
};

/** The built assets, read once; an unbuilt checkout serves a page that says so instead of a broken one. */
let assets: Map<string, { body: Buffer; type: string }> | null = null;
function loadAssets(): Map<string, { body: Buffer; type: string }> {
  if (assets) return assets;
  const dir = fromRoot('dist', 'dashboard');
  const out = new Map<string, { body: Buffer; type: string }>();
  try {
    for (const name of readdirSync(dir)) {
      const type = TYPES[name.slice(name.lastIndexOf('.'))];
      if (type) out.set(name, { body: readFileSync(`${dir}/${name}`), type });
    }
  } catch {
    /* not built: the shell's scripts 404 and the page shows its noscript text */
  }
  if (out.size > 0) assets = out;
  return out;
}

/** Forgets the loaded assets (tests rebuild them). */
export function reloadDashboardAssets(): void {
  assets = null;
}

function shell(entry: 'app' | 'intake'): string {
  const title = entry === 'intake' ? 'Enter a credential · poolgate' : 'poolgate';
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>${title}</title>
<link rel="stylesheet" href="${DASHBOARD_PATH}/assets/${entry}.css">
<script type="module" src="${DASHBOARD_PATH}/assets/${entry}.js"></script>
</head>
<body>
<a class="skip" href="#main">Skip to content</a>
<div id="app"><main id="main"><noscript>The poolgate dashboard needs JavaScript.</noscript><p class="loading">Loading…</p></main></div>
</body>
</html>
`;
}

export function sendPage(reply: FastifyReply, entry: 'app' | 'intake'): FastifyReply {
  return reply.code(200).headers(SECURITY_HEADERS).type('text/html; charset=utf-8').send(shell(entry));
}

export function dashboardRoutes(app: FastifyInstance): void {
  const page = { config: { public: true }, schema: { hide: true } } as const;
  app.get(DASHBOARD_PATH, page, async (_req, reply) => sendPage(reply, 'app'));
  // Every page of the single-page app gets the same shell; the script routes by path.
  app.get(`${DASHBOARD_PATH}/*`, page, async (req, reply) => {
    const rest = (req.params as { '*': string })['*'];
    if (rest.startsWith('assets/')) {
      const asset = loadAssets().get(rest.slice('assets/'.length));
      if (!asset) return reply.code(404).headers(SECURITY_HEADERS).type('text/plain; charset=utf-8').send('not found');
      return reply.code(200).headers(SECURITY_HEADERS).header('cache-control', 'no-cache').type(asset.type).send(asset.body);
    }
    return sendPage(reply, 'app');
  });
}
