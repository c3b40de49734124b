/**
 * A process's identity that survives pid reuse: its pid and its start time
 * from `/proc/<pid>/stat`, both written by the kernel.
 *
 * @module
 */

/**
 * "pid starttime" of a live process: the same pid later reused by another
 * process reads differently, and a dead one reads as undefined.
 *
 * @param pid The process id (in this process's pid namespace).
 * @returns The mark, or undefined when no such process is visible.
 */
export function processMark(pid: number): string | undefined {
  try {
    const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
    // Fields after the command name, which may itself hold ") ".
    return `${pid} ${stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19]}`;
  } catch {
    return undefined;
  }
}
