/**
 * Streaming `multipart/form-data` for `POST /files`, on busboy (loaded only
 * by an upload).
 *
 * @module
 */
// @ts-types="npm:@types/busboy@1.5.5"
import busboy from "busboy";
import { Readable } from "node:stream";
import type { ReadableStream as NodeWebStream } from "node:stream/web";

/** Most files one multipart upload may carry. */
const MAX_UPLOAD_FILES = 1000;

/** The largest plain form field (a `file` sent as text is one). */
const FIELD_BYTES = 1024 * 1024;

/**
 * The files of a `multipart/form-data` body, one at a time, each a stream:
 * busboy parses as the bytes come, so a file of any size passes through in
 * bounded memory (the next file is parsed once this one is consumed).
 */
export async function* multipartFiles(
  body: ReadableStream<Uint8Array>,
  contentType: string,
): AsyncGenerator<{ name: string; data: ReadableStream<Uint8Array> }> {
  const parser = busboy({
    headers: { "content-type": contentType },
    // A file's name is its path in the sandbox (the SDK's writeFiles), kept whole.
    preservePath: true,
    limits: {
      files: MAX_UPLOAD_FILES,
      fields: 16,
      fieldSize: FIELD_BYTES,
      parts: 2 * MAX_UPLOAD_FILES,
    },
  });
  const files: { name: string; data: ReadableStream<Uint8Array> }[] = [];
  let wake: (() => void) | undefined;
  let ended = false;
  let failure: unknown;
  const notify = (): void => {
    wake?.();
    wake = undefined;
  };
  parser.on("file", (_field, stream, info) => {
    files.push({
      name: info.filename ?? "",
      data: Readable.toWeb(stream) as ReadableStream<Uint8Array>,
    });
    notify();
  });
  // A `file` sent as a plain form field (FormData.append('file', 'text'), no
  // file name) is the file's content too: its name comes from `path`.
  parser.on("field", (field, value, info) => {
    if (field !== "file") return;
    if (info.valueTruncated) {
      failure = new Error(`The form field 'file' is over ${FIELD_BYTES} bytes: send it as a file`);
    } else {
      files.push({ name: "", data: new Blob([value]).stream() });
    }
    notify();
  });
  parser.on("filesLimit", () => {
    failure = new Error(`More than ${MAX_UPLOAD_FILES} files in one upload`);
    notify();
  });
  parser.on("error", (cause) => {
    failure = cause;
    notify();
  });
  parser.on("close", () => {
    ended = true;
    notify();
  });
  Readable.fromWeb(body as NodeWebStream<Uint8Array>).pipe(parser);
  while (true) {
    if (failure !== undefined) throw failure;
    const next = files.shift();
    if (next !== undefined) {
      yield next;
      continue;
    }
    if (ended) return;
    await new Promise<void>((resolve) => wake = resolve);
  }
}
