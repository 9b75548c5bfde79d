// Soak, scale and fuzz tests run twice over the same code: a small version in the default suite
// (`npm test`, minutes) and the full one in test/soak/ (`npm run test:soak`, run by CI). A file in
// test/soak/ sets POOLGATE_SOAK=1 and imports its default-suite file, whose counts come from `soak()`.

/** True in a soak run (a test/soak/ file, or POOLGATE_SOAK=1 in the environment). */
export const SOAK = process.env.POOLGATE_SOAK === '1';

/** The full value in a soak run, the small one in the default suite. */
export function soak<T>(full: T, small: T): T {
  return SOAK ? full : small;
}
