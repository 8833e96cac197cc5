// Copies the API definition (cronoq/_proto/cronoq.proto, the one source of
// truth) into this package's proto/ folder, which the package ships and
// loads at run time.
import { copyFileSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const source = join(here, "..", "..", "..", "cronoq", "_proto", "cronoq.proto");
const target = join(here, "..", "proto", "cronoq.proto");
mkdirSync(dirname(target), { recursive: true });
copyFileSync(source, target);
