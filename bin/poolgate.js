#!/usr/bin/env -S node --max-semi-space-size=32
// Entry for `npx poolgate`: runs the compiled CLI (built once at install by the `prepare` script; `npm run build`
// rebuilds it; npm start never builds, so a second start cannot rewrite a running instance's files). The V8 flag gives the
// young generation room for a proxy's short-lived buffers: see docs/decisions/runtime.md.
import('../dist/src/cli.js').then((m) => m.main(process.argv.slice(2))).catch((err) => {
  if (err && err.code === 'ERR_MODULE_NOT_FOUND' && String(err.message).includes('dist/src/cli.js')) {
    console.error('poolgate is not built: run `npm run build` (npm install/ci build it unless the sources were absent).');
  } else {
    console.error(err);
  }
  process.exit(1);
});
