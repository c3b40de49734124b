/**
 * waffle's sandboxes on Kubernetes: each an agent-sandbox `Sandbox` whose pod
 * runs the runner in the user's image and waffle's agent beside it.
 *
 * @module
 */
export {
  type BuildImageOptions,
  buildWaffleImage,
  copyKit,
  KIT_ENTRIES,
  WAFFLE_IMAGE_ARTEFACT_LABEL,
  WAFFLE_IMAGE_REPO,
  type WaffleImage,
} from "./image.ts";
