/// <reference lib="dom" />
/**
 * A sandbox's snapshots: list, take (with progress), delete.
 *
 * @module
 */
import type { JSX } from "preact";
import { api, seg } from "../api.ts";
import { ask, showError, usePoll, withProgress } from "../state.ts";
import { Table } from "./common.tsx";

interface Snapshot {
  snapshotID: string;
  names?: string[];
}

/**
 * @param props The sandbox.
 * @returns The snapshots tab.
 */
export function SnapshotsView(props: { sandboxId: string }): JSX.Element {
  const [list, reload] = usePoll(
    () => api<Snapshot[]>("GET", `/snapshots?sandboxID=${seg(props.sandboxId)}`),
    { ms: 5000, deps: [props.sandboxId] },
  );
  const take = (): void =>
    void withProgress(
      `Snapshot of ${props.sandboxId}`,
      () => api("POST", `/sandboxes/${seg(props.sandboxId)}/snapshots`, {}),
    ).then(reload);
  const remove = async (id: string): Promise<void> => {
    if (!await ask(`Delete snapshot ${id}?`, "Delete")) return;
    try {
      await api("DELETE", `/templates/${seg(id)}`);
    } catch (error) {
      showError(error);
    }
    reload();
  };
  return (
    <div>
      <div class="row">
        <button type="button" data-action="snapshot" onClick={take}>Take a snapshot</button>
      </div>
      <Table testid="snapshots" label="Snapshots" head={["Snapshot", "Names", ""]}>
        {(list ?? []).map((snapshot) => (
          <tr key={snapshot.snapshotID} data-snapshot-id={snapshot.snapshotID}>
            <td class="mono">{snapshot.snapshotID}</td>
            <td>{(snapshot.names ?? []).join(", ") || "–"}</td>
            <td>
              <button
                type="button"
                class="danger"
                data-action="delete-snapshot"
                onClick={() =>
                  void remove(snapshot.snapshotID)}
              >
                Delete
              </button>
            </td>
          </tr>
        ))}
      </Table>
    </div>
  );
}
