/**
 * waffle and the user's terminal: sandbox text printed with its controls
 * escaped ({@linkcode escapeControls}), the output filter of `waffle shell`
 * ({@linkcode ScreenFilter}) and its escape keys ({@linkcode EscapeKeys}).
 *
 * @module
 */
export { escapeControls, type EscapeControlsOptions } from "./control_text.ts";
export { localeIsUtf8, terminalIsUtf8 } from "./locale.ts";
export { QUERY_BURST, QUERY_INTERVAL_MS, QueryLimit } from "./query_limit.ts";
export { EscapeKeys, type EscapeKeysResult } from "./escape_keys.ts";
export { ScreenFilter, type ScreenFilterOptions } from "./screen_filter.ts";
export { MAX_SEQUENCE_CHARS, SequenceReader, type Token } from "./sequence_reader.ts";
