// Run once by scripts/test.mjs before tap starts the test processes: builds the run's store template, so that
// the first test processes, which all start at once, find it made rather than wait on one of them to make it.
import { pgliteTemplate } from './pglite-template.js';

await pgliteTemplate();
