// A real browser for the dashboard's end-to-end tests: Debian's chromium driven by playwright-core (no
// browser download). Absent chromium skips the test with a reason outside CI and fails it in CI, as the
// backing servers do (test/helpers/servers.ts).
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium, type BrowserContext, type Page } from 'playwright-core';
import { pathToFileURL } from 'node:url';
import { reloadDashboardAssets } from '../../src/dashboard/serve.js';
import { fromRoot } from '../../src/config/paths.js';

export const CHROMIUM = process.env.POOLGATE_TEST_CHROMIUM ?? '/usr/bin/chromium';

/** `false` to run; a skip reason when chromium is absent outside CI. Throws in CI. */
export function needChromium(): false | string {
  if (existsSync(CHROMIUM)) return false;
  if (process.env.CI) throw new Error(`${CHROMIUM} is missing; CI installs Debian's chromium (.ci/run)`);
  return `${CHROMIUM} is not installed (apt-get install chromium)`;
}

let built: Promise<unknown> | null = null;
/** The dashboard's bundles as `npm run build` makes them, so a test run without a build still serves them. */
export function ensureDashboardBuilt(): Promise<unknown> {
  // Found from the package root: this module also runs compiled, from dist/test/helpers/.
  const script = pathToFileURL(fromRoot('scripts', 'build-dashboard.mjs')).href;
  built ??= (import(script) as Promise<typeof import('../../scripts/build-dashboard.mjs')>)
    .then(({ buildDashboard }) => buildDashboard())
    .then(() => reloadDashboardAssets());
  return built;
}

export interface Browser {
  context: BrowserContext;
  page: Page;
  close(): Promise<void>;
}

/** A fresh headless chromium with its own empty profile. */
export async function launchBrowser(opts: { viewport?: { width: number; height: number } } = {}): Promise<Browser> {
  const profile = mkdtempSync(join(tmpdir(), 'poolgate-chromium-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--disable-sync', '--no-first-run'],
    viewport: opts.viewport ?? { width: 1280, height: 860 },
  });
  const page = context.pages()[0] ?? (await context.newPage());
  return {
    context,
    page,
    async close() {
      await context.close().catch(() => {});
      rmSync(profile, { recursive: true, force: true });
    },
  };
}
