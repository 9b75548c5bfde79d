// Run once by scripts/test.mjs before tap starts the test processes: builds the run's store template and loads
// the service's modules, so that tsx's transform cache (kept per file path) holds them. In a fresh clone the
// first test processes all start at once and would each transform the same few hundred source files.
import { pgliteTemplate } from './pglite-template.js';

await Promise.all([pgliteTemplate(), import('./service.js')]);
