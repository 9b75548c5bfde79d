// Loaded into tap's runner process by scripts/test.mjs (`node --import`), before tap itself.
//
// tap loads @tapjs/processinfo into every test process (and into every worker thread and node child a test
// starts: it puts itself in NODE_OPTIONS). With coverage off, what it still does is record each module a process
// loads: it reads the file again, scans it for a source-map comment and keeps line lengths, for `tap --changed`
// and coverage reports, neither of which this project uses (`disable-coverage`). Measured on the 2-core machine
// (2026-11-28), that bookkeeping is ~0.35 s of CPU in a process that loads the service (~670 modules), ~1.75 s
// against ~1.4 s without it: about a tenth of `npm test`'s CPU over ~128 test processes.
//
// processinfo skips the files its exclude pattern matches (`_TAPJS_PROCESSINFO_EXCLUDE_`), which the runner takes
// from its own environment when it starts each test process; tap's run command sets it to its own pattern when it
// starts (no option sets it). Here the variable is set to match every file and kept at that: the environment seen
// by the runner becomes a view of the real one that ignores writes to that one variable. Everything else
// processinfo does (the process tree, timing, exit codes tap reports) is unchanged. `tap --changed`, which reads
// those file lists, is not used here; a run with coverage should not load this file.
const KEY = '_TAPJS_PROCESSINFO_EXCLUDE_';
const env = process.env;
env[KEY] = '/./';
process.env = new Proxy(env, {
  set(target, key, value) {
    if (key !== KEY) target[key] = value;
    return true;
  },
});
