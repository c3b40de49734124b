/**
 * The hostile suites again, on forked sandboxes: every test home of this
 * module fills a warm pool of two with forks of one seed sandbox
 * (`poolEveryHome(2, { forked: true })`), so the first two sandboxes each
 * test opens are forks (a copied volume image, a fresh queue and
 * `outbound/`) taken by their users. Every attack, as a command and as a
 * compromised runner, must hold as it does on cold sandboxes. The names
 * carry " [forked]".
 *
 * @module
 */
import { suffixTestNames } from "./_helpers.ts";
import { poolEveryHome } from "./_sandbox_helpers.ts";

poolEveryHome(2, { forked: true });
suffixTestNames(" [forked]");
await import("./hostile_runner_test.ts");
await import("./hostile_files_test.ts");
