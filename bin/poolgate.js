#!/usr/bin/env node
// Entry for `npx poolgate`: runs the compiled CLI (npm start and npm test build it first).
import('../dist/src/cli.js').then((m) => m.main(process.argv.slice(2))).catch((err) => {
  if (err && err.code === 'ERR_MODULE_NOT_FOUND' && String(err.message).includes('dist/src/cli.js')) {
    console.error('poolgate is not built: run `npm run build` first.');
  } else {
    console.error(err);
  }
  process.exit(1);
});
