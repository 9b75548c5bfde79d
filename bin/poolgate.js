#!/usr/bin/env -S node --max-semi-space-size=32
// Entry for `npx poolgate`: runs the compiled CLI (npm start and npm test build it first). The V8 flag gives the
// young generation room for a proxy's short-lived buffers: see docs/decisions/runtime.md.
import('../dist/src/cli.js').then((m) => m.main(process.argv.slice(2))).catch((err) => {
  if (err && err.code === 'ERR_MODULE_NOT_FOUND' && String(err.message).includes('dist/src/cli.js')) {
    console.error('poolgate is not built: run `npm run build` first.');
  } else {
    console.error(err);
  }
  process.exit(1);
});
