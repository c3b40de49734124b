/**
 * The hostile suites again, on sandboxes taken from a warm pool: every test
 * home of this module fills a pool of two first (`poolEveryHome`), so the
 * first two sandboxes each test opens are pool members taken by their
 * users. Every attack, as a command and as a compromised runner, must hold
 * as it does on cold sandboxes. The names carry " [pooled]".
 *
 * @module
 */
import { suffixTestNames } from "./_helpers.ts";
import { poolEveryHome } from "./_sandbox_helpers.ts";

poolEveryHome(2);
suffixTestNames(" [pooled]");
await import("./hostile_runner_test.ts");
await import("./hostile_files_test.ts");
