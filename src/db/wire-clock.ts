// The wire listeners' monotonic clock, in milliseconds, for what they time per transaction (a link's wait and
// hold, a server connection's idle time). performance.now() checks its receiver's brand (hasOwnProperty
// through Node's validators) on every call: ≈ 250 instructions a read against ≈ 120 for process.hrtime()
// (callgrind, TurboFan-compiled callers), and a transaction reads the clock twice here. Its origin is its own:
// compare its readings only with each other, never with performance.now()'s.
const hrtime = process.hrtime;

export function wireNow(): number {
  const t = hrtime();
  return t[0]! * 1e3 + t[1]! / 1e6;
}
