/**
 * A record of the daemon's container and volume events while a test runs
 * (`docker events`): which containers were created with which labels, and
 * which volumes Docker mounted into them. It sees what a container got even
 * after the container and its volumes are gone.
 *
 * @module
 */
import { dockerCli } from "./_sandbox_helpers.ts";

/** One event, as `docker events --format '{{json .}}'` prints it. */
export interface DockerEvent {
  Type: string;
  Action: string;
  Actor: { ID: string; Attributes: Record<string, string> };
}

/** A volume Docker mounted into a container. */
export interface VolumeMount {
  /** The volume's name (64 hex digits for an anonymous one). */
  volume: string;
  /** Where in the container. */
  destination: string;
  /** The container's name at its creation. */
  container: string;
}

/** The events since the recorder started; `stop` ends it. */
export interface EventRecorder {
  /**
   * Ends the record once every event before the call has arrived (a marker
   * volume's creation, made after, has).
   *
   * @returns The events, oldest first.
   */
  stop(): Promise<DockerEvent[]>;
}

/**
 * Starts recording container and volume events. `--since` its start, so
 * events between the call and the subscription are replayed, not lost.
 *
 * @returns The recorder.
 */
export function recordDockerEvents(): EventRecorder {
  const since = (Date.now() / 1000 - 1).toFixed(3);
  const child = new Deno.Command("docker", {
    args: [
      "events",
      "--since",
      since,
      "--filter",
      "type=container",
      "--filter",
      "type=volume",
      "--format",
      "{{json .}}",
    ],
    stdin: "null",
    stdout: "piped",
    stderr: "null",
  }).spawn();
  const lines = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  const events: DockerEvent[] = [];
  let buffered = "";
  const readUntil = async (marker: string): Promise<void> => {
    for (;;) {
      const { value, done } = await lines.read();
      if (done) throw new Error(`docker events ended before the marker '${marker}'`);
      buffered += value;
      const complete = buffered.split("\n");
      buffered = complete.pop() ?? "";
      for (const line of complete.filter((l) => l.trim() !== "")) {
        const event = JSON.parse(line) as DockerEvent;
        if (event.Type === "volume" && event.Actor.ID === marker) return;
        events.push(event);
      }
    }
  };
  return {
    async stop(): Promise<DockerEvent[]> {
      const marker = `waffle-test-events-${crypto.randomUUID()}`;
      try {
        const made = await dockerCli(["volume", "create", marker]);
        if (made.code !== 0) throw new Error(`docker volume create: ${made.stderr}`);
        await readUntil(marker);
      } finally {
        await dockerCli(["volume", "rm", marker]);
        child.kill("SIGTERM");
        await lines.cancel().catch(() => {});
        await child.status;
      }
      return events;
    },
  };
}

/**
 * The volumes Docker mounted into the containers that `ours` picks out by
 * their labels at creation (events carry a container's labels).
 *
 * @param events The record.
 * @param ours Picks a container by its creation event's attributes (name, image, labels).
 * @returns The mounts, in order.
 */
export function volumesMountedInto(
  events: readonly DockerEvent[],
  ours: (attributes: Record<string, string>) => boolean,
): VolumeMount[] {
  const names = new Map<string, string>();
  for (const event of events) {
    if (event.Type === "container" && event.Action === "create" && ours(event.Actor.Attributes)) {
      names.set(event.Actor.ID, event.Actor.Attributes.name ?? event.Actor.ID);
    }
  }
  return events.filter((event) =>
    event.Type === "volume" && event.Action === "mount" &&
    names.has(event.Actor.Attributes.container ?? "")
  ).map((event) => ({
    volume: event.Actor.ID,
    destination: event.Actor.Attributes.destination ?? "?",
    container: names.get(event.Actor.Attributes.container ?? "") ?? "?",
  }));
}
