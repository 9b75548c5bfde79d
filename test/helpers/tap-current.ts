// The `t` a test file's top level uses. Run alone it is tap's root; in a group (scripts/build-tests.mjs) it is
// the file's own subtest, set by the group entry before the file is imported, so the file's tests, `before`
// and teardowns belong to that subtest: they run, end and report under the file's name before the next file
// starts. The build rewrites `from 'tap'` in compiled tests to this module; `export { current as default }`
// is a live binding, so each file sees the value set when it is imported.
import tap from 'tap';
import type { Test } from 'tap';

let current: Test = tap;
export { current as default };

export function setCurrentTest(t: Test): void {
  current = t;
}
