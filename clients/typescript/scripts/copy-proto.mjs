// Copies the API definition (cronoq/_proto/cronoq.proto, the one source of
// truth) into this package's proto/ folder, which the Node entry loads at run
// time, and writes its JSON descriptor as src/descriptor.generated.ts for the
// browser entry (a page cannot read .proto files from disk).
import { copyFileSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import protobuf from "protobufjs";

const here = dirname(fileURLToPath(import.meta.url));
const source = join(here, "..", "..", "..", "cronoq", "_proto", "cronoq.proto");
const target = join(here, "..", "proto", "cronoq.proto");
mkdirSync(dirname(target), { recursive: true });
copyFileSync(source, target);

// keepCase: field names stay the proto's snake_case, as in the Node entry.
const descriptor = protobuf.parse(readFileSync(target, "utf8"), { keepCase: true }).root.toJSON();
writeFileSync(join(here, "..", "src", "descriptor.generated.ts"),
  "// Generated from cronoq/_proto/cronoq.proto by scripts/copy-proto.mjs: do not edit.\n" +
  "import type { INamespace } from \"protobufjs\";\n\n" +
  `const json: unknown = ${JSON.stringify(descriptor)};\n// (protobufjs types map fields and methods more narrowly than its own toJSON writes them)\n` +
  "export const DESCRIPTOR = json as INamespace;\n");
