/**
 * `waffle doctor`'s egress row: the home's proxy and whether it answers.
 *
 * @module
 */
import { loadWaffleConfig } from "../config/config.ts";
import { DockerClient } from "../docker/client.ts";
import { egressStatus } from "../egress/status.ts";
import type { DoctorCheck } from "./doctor.ts";

/**
 * The egress check of this home.
 *
 * @param options The config file, when one was named.
 * @returns One check.
 */
export function egressChecks(options: { configPath?: string | undefined }): DoctorCheck[] {
  const config = loadWaffleConfig({ configPath: options.configPath });
  return [{
    name: "egress proxy",
    run: async () => {
      const status = await egressStatus(new DockerClient(), config.sandbox.home);
      const attached = config.sandbox.egress !== undefined;
      if (status.proxy === null) {
        return attached
          ? "not started yet: the first call of a sandbox with [sandbox] egress starts it"
          : 'not used: no [sandbox] egress (sandboxes have network "' +
            config.sandbox.network + '")';
      }
      if (!status.answering.ok) {
        throw new Error(`${status.proxy.name} ${status.proxy.state}: ${status.answering.detail}`);
      }
      const ca = status.ca === null ? "no CA" : `CA SHA-256 ${status.ca.fingerprint.slice(0, 23)}…`;
      return `${status.proxy.name} ${status.proxy.state}, answers in ${
        status.answering.ms.toFixed(1)
      } ms, ${status.identities.length} identities, ${ca}, audit ${status.audit.path}`;
    },
  }];
}
