// Loads uWebSockets.js (the optional second front door, src/http/uws/). The package we install can silently fall back to a slow pure-JS
// server when its native binary does not load; we refuse to run on that fallback.
import { createRequire } from 'node:module';
import type * as UwsTypes from 'uWebSockets.js';

const require = createRequire(import.meta.url);

export class UwsUnavailableError extends Error {
  override name = 'UwsUnavailableError';
}

let loaded: typeof UwsTypes | null = null;

export function loadUws(): typeof UwsTypes {
  if (loaded) return loaded;
  if (/^(1|true)$/i.test(process.env.UWS_USE_FALLBACK ?? '')) {
    throw new UwsUnavailableError('UWS_USE_FALLBACK is set: poolgate runs only on the native uWebSockets.js server. Unset it.');
  }
  // The unofficial build prints its own warning and falls back instead of throwing; silence it and judge by what loaded.
  const warn = console.warn;
  const log = console.log;
  console.warn = () => {};
  console.log = () => {};
  let mod: typeof UwsTypes;
  try {
    mod = require('uWebSockets.js') as typeof UwsTypes;
  } finally {
    console.warn = warn;
    console.log = log;
  }
  const native = Object.keys(require.cache).some((k) => /uWebSockets\.js[\\/].*\.node$/.test(k) || /uws_[^\\/]+\.node$/.test(k));
  if (!native) {
    throw new UwsUnavailableError(
      `uWebSockets.js has no native build for this platform (${process.platform}-${process.arch}, Node ABI ${process.versions.modules}); ` +
        'poolgate refuses to run on its slow pure-JS fallback. The build poolgate installs (20.30) has native binaries for Node.js 20 only: ' +
        'leave proxyHttpParser at node (the default), or run that option on Node.js 20.',
    );
  }
  loaded = mod;
  return mod;
}

/** Whether the native uWebSockets.js build loads here (tests of the `uws` option run only where it does). */
export function uwsLoads(): boolean {
  try {
    loadUws();
    return true;
  } catch (err) {
    if (err instanceof UwsUnavailableError) return false;
    throw err;
  }
}
