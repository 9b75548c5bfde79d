// The SSRF guard for a JWT policy's JWKS URL when the setting is written: the host must be public (unless
// allowPrivateTargets) and not this service. The fetch itself is guarded again at connect time (jwt.ts).
import { SettingsError } from '../store/pool-settings.js';
import type { SettingsPatch } from '../store/pool-settings-store.js';
import { checkTarget, type TargetPolicy } from '../security/targets.js';

/** Throws SettingsError (a 422 naming the field) when the patch sets a JWKS URL whose host is refused. */
export async function checkJwksTarget(patch: SettingsPatch, targets: TargetPolicy): Promise<void> {
  const jwt = (patch.settings as { jwt?: { jwksUrl?: unknown } | null } | undefined)?.jwt;
  if (!jwt || typeof jwt.jwksUrl !== 'string') return;
  let host: string;
  try {
    host = new URL(jwt.jwksUrl).hostname;
  } catch {
    return; // not a URL: the settings check names that
  }
  const verdict = await checkTarget(host, targets);
  if (!verdict.ok) throw new SettingsError(`settings.jwt.jwksUrl: ${host} is refused: ${verdict.reason}`);
}
