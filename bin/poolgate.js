#!/usr/bin/env -S node --max-semi-space-size=32 --liftoff-only
// Entry for `npx poolgate`: runs the compiled CLI (built once at install by the `prepare` script; `npm run build`
// rebuilds it; npm start never builds, so a second start cannot rewrite a running instance's files). The V8 flags give the
// young generation room for a proxy's short-lived buffers and keep the embedded store's WebAssembly out of TurboFan
// (idle RSS 265 -> 217 MB, start-up peak 775 -> 217 MB): see docs/runtime.md.
// Node.js 24 (docs/runtime.md). On a host whose system Node is older, `npm ci` installs Node 24 as
// node_modules/.bin/node, which npm scripts and npx put first on PATH; a shell that runs this file directly does not.
const major = Number(process.versions.node.split('.')[0]);
if (major < 24) {
  console.error(
    `poolgate needs Node.js 24 or later; this is ${process.version} (${process.execPath}). ` +
      'Run it through npm or npx (npm start, npx poolgate …), which use the Node 24 that npm ci installed in node_modules/.bin, or install Node.js 24.',
  );
  process.exit(1);
}
// The nextTick tick object is held before the CLI's module graph loads (a mark-compact can run while it does):
// docs/runtime.md, "The nextTick tick object". startService holds it too, for in-process starts.
import('../dist/src/runtime/tick-shape.js')
  .then((t) => {
    t.holdTickShape();
    return import('../dist/src/cli.js');
  })
  .then((m) => m.main(process.argv.slice(2)))
  .catch((err) => {
    if (err && err.code === 'ERR_MODULE_NOT_FOUND' && String(err.message).includes('dist/src/')) {
      console.error('poolgate is not built: run `npm run build` (npm install/ci build it unless the sources were absent).');
    } else {
      console.error(err);
    }
    process.exit(1);
  });
