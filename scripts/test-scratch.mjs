// The tests' scratch space: TMPDIR for the test processes, a directory of its own in /dev/shm when that is a roomy
// tmpfs, removed when the run ends. Every service a test starts keeps its store (a ~25 MB PGlite data dir of
// ~480 files), its sockets and its files under os.tmpdir(). On ext4 a copy and removal of that data dir cost
// ~0.38 s of system time (file creation and the journal, not the bytes) and each commit's fsync waits on the
// disk; in memory the copy costs ~40 ms and fsync nothing. What the tests check does not change: a SIGKILL
// loses what is in a process, never the page cache, on either file system.
import { existsSync, mkdtempSync, readdirSync, rmSync, statfsSync } from 'node:fs';
import { join } from 'node:path';

const SHM = '/dev/shm';
const TMPFS_MAGIC = 0x01021994;
const PREFIX = 'poolgate-test-';
/** Less free than this (a container's default /dev/shm is 64 MiB) and the tests keep the usual TMPDIR. */
const MIN_FREE = 2 * 1024 ** 3;

function alive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return err.code === 'EPERM';
  }
}

/** A fresh scratch dir in /dev/shm, or null where there is no roomy tmpfs there (the tests then use the usual TMPDIR). */
export function makeScratch() {
  try {
    if (!existsSync(SHM)) return null;
    const fs = statfsSync(SHM);
    if (fs.type !== TMPFS_MAGIC || fs.bavail * fs.bsize < MIN_FREE) return null;
    // Runs that were killed before they could remove theirs (the name holds the runner's pid).
    for (const name of readdirSync(SHM)) {
      const pid = Number(name.slice(PREFIX.length).split('-')[0]);
      if (name.startsWith(PREFIX) && pid && !alive(pid)) rmSync(join(SHM, name), { recursive: true, force: true });
    }
    return mkdtempSync(join(SHM, `${PREFIX}${process.pid}-`));
  } catch {
    return null;
  }
}

export function removeScratch(dir) {
  if (dir) rmSync(dir, { recursive: true, force: true });
}
