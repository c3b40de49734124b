/**
 * The shapes of waffle's console API as the page reads them: the server's
 * own copy (`lib/serve/console_types.ts`, types only, importing nothing), so
 * a field changed on one side fails to compile on the other.
 *
 * @module
 */

export type {
  ConsoleCommand,
  ConsoleSandbox,
  EgressEntry,
  EgressView,
  McpEntry,
  McpView,
  SandboxMetric,
  WhoAmI,
} from "../lib/serve/console_types.ts";
