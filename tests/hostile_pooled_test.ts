/**
 * The hostile suites again, on sandboxes taken from a warm pool: every test
 * home of this module fills a pool of two first (`poolEveryHome`), so the
 * first two sandboxes each test opens are pool members taken by their
 * users. Every attack, as a command and as a compromised runner, must hold
 * as it does on cold sandboxes. The names carry " [pooled]".
 *
 * @module
 */
import { poolEveryHome } from "./_sandbox_helpers.ts";

poolEveryHome(2);
const register = Deno.test;
// Named apart from the cold runs in the report.
Object.defineProperty(Deno, "test", {
  value: ((first: unknown, ...rest: unknown[]) => {
    if (typeof first === "string") {
      return (register as (...a: unknown[]) => void)(`${first} [pooled]`, ...rest);
    }
    const options = first as Deno.TestDefinition;
    return register({ ...options, name: `${options.name} [pooled]` });
  }) as typeof Deno.test,
});
await import("./hostile_runner_test.ts");
await import("./hostile_files_test.ts");
