/// <reference lib="dom" />
/**
 * A sandbox's files: browse with envd's `filesystem.ListDir`, download with
 * `GET /files` (fetched with the token header, saved from a blob), upload
 * with `POST /files` (multipart, by XMLHttpRequest for its progress).
 *
 * @module
 */
import type { JSX } from "preact";
import { useState } from "preact/hooks";
import { FileType } from "../../lib/serve/gen/filesystem/filesystem_pb.ts";
import { envdOf } from "../api.ts";
import { usePoll, withProgress } from "../state.ts";
import { formatBytes, Table } from "./common.tsx";

const HOME = "/home/user";
/** The most entries of a directory the table renders. */
const SHOWN_MAX = 1000;

/**
 * @param props The sandbox.
 * @returns The files tab.
 */
export function FilesView(props: { sandboxId: string }): JSX.Element {
  const [path, setPath] = useState(HOME);
  const [huge, setHuge] = useState(false);
  const [listing, reload] = usePoll(async () => {
    const envd = await envdOf(props.sandboxId);
    const answer = await envd.filesystem.listDir({ path, depth: 1 });
    const all = answer.entries.map((entry) => ({
      name: entry.name,
      path: entry.path,
      dir: entry.type === FileType.DIRECTORY,
      size: Number(entry.size),
    })).sort((a, b) => Number(b.dir) - Number(a.dir) || a.name.localeCompare(b.name));
    setHuge(all.length > SHOWN_MAX);
    // A huge directory would freeze the page as a table: keep the first rows.
    return { path, entries: all.slice(0, SHOWN_MAX), total: all.length };
  }, {
    ms: 5000,
    // Re-listing a huge directory every 5 s costs the sandbox and the page:
    // it is listed again only on demand (the Refresh button).
    paused: huge,
    deps: [props.sandboxId, path],
  });
  // Until the new directory's answer arrives, show none rather than the old one's.
  const current = listing?.path === path ? listing : undefined;
  const entries = current?.entries;
  const hidden = (current?.total ?? 0) - (entries?.length ?? 0);
  const up = (): void => setPath(parentOf(path));
  return (
    <div>
      <div class="row">
        <button type="button" data-action="up" onClick={up} disabled={path === "/"}>Up</button>
        <code data-testid="path">{path}</code>
        <button type="button" data-action="refresh" onClick={reload}>Refresh</button>
        <label class="upload">
          Upload{" "}
          <input
            type="file"
            data-testid="upload"
            onChange={(event) => {
              const input = event.currentTarget;
              const file = input.files?.[0];
              if (file === undefined) return;
              void upload(props.sandboxId, joinPath(path, file.name), file).then(() => {
                input.value = "";
                reload();
              });
            }}
          />
        </label>
      </div>
      <Table testid="files" label="Files" head={["Name", "Size", ""]}>
        {(entries ?? []).map((entry) => (
          <tr key={entry.name} data-name={entry.name}>
            <td class="mono">
              {entry.dir
                ? (
                  <button
                    type="button"
                    class="link"
                    onClick={() => setPath(joinPath(path, entry.name))}
                  >
                    {`${entry.name}/`}
                  </button>
                )
                : entry.name}
            </td>
            <td>{entry.dir ? "–" : formatBytes(entry.size)}</td>
            <td>
              {entry.dir ? null : (
                <button
                  type="button"
                  data-action="download"
                  aria-label={`Download ${entry.name}`}
                  onClick={() =>
                    void download(props.sandboxId, joinPath(path, entry.name), entry.name)}
                >
                  Download
                </button>
              )}
            </td>
          </tr>
        ))}
      </Table>
      {hidden > 0
        ? <p class="muted" data-testid="files-more">{`${hidden} more entries not shown`}</p>
        : null}
    </div>
  );
}

function joinPath(dir: string, name: string): string {
  return dir.endsWith("/") ? `${dir}${name}` : `${dir}/${name}`;
}

function parentOf(path: string): string {
  const at = path.replace(/\/+$/, "").lastIndexOf("/");
  return at <= 0 ? "/" : path.slice(0, at);
}

function download(sandboxId: string, path: string, name: string): Promise<unknown> {
  return withProgress(`Downloading ${name}`, async () => {
    const envd = await envdOf(sandboxId);
    const response = await fetch(`/files?path=${encodeURIComponent(path)}`, {
      headers: envd.headers,
      credentials: "omit",
    });
    if (!response.ok) {
      const text = await response.text();
      let message = `${response.status} ${response.statusText}`;
      try {
        message = (JSON.parse(text) as { message?: string }).message ?? message;
      } catch {
        // Not JSON: the status says it.
      }
      throw new Error(`Cannot download '${path}': ${message}`);
    }
    const url = URL.createObjectURL(await response.blob());
    const link = document.createElement("a");
    link.href = url;
    link.download = name;
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60_000);
  });
}

function upload(sandboxId: string, path: string, file: File): Promise<unknown> {
  return withProgress(`Uploading ${file.name}`, async (report) => {
    const envd = await envdOf(sandboxId);
    const form = new FormData();
    form.append("file", file, file.name);
    await new Promise<void>((resolve, reject) => {
      const request = new XMLHttpRequest();
      request.open("POST", `/files?path=${encodeURIComponent(path)}`);
      for (const [name, value] of Object.entries(envd.headers)) {
        request.setRequestHeader(name, value);
      }
      request.upload.onprogress = (event) => {
        if (event.lengthComputable) report(event.loaded / event.total);
      };
      request.onload = () => {
        if (request.status >= 200 && request.status < 300) resolve();
        else reject(new Error(`Cannot upload '${path}': ${messageOf(request.responseText)}`));
      };
      request.onerror = () => reject(new Error(`Cannot upload '${path}': network error`));
      request.send(form);
    });
  });
}

function messageOf(text: string): string {
  try {
    return (JSON.parse(text) as { message?: string }).message ?? text.slice(0, 200);
  } catch {
    return text.slice(0, 200);
  }
}
