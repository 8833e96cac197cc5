// The task drawer's details: the payload (the leader's preview of it), the
// output (its first OUTPUT_BYTES, read with the result's max_bytes) or the
// error with the worker's traceback, each attempt's traceback; and the rows
// of the Events page open the drawer of their task.
import {$, api, app, on, openDrawer, TERMINAL} from "./app.js";

const OUTPUT_BYTES = 64 * 1024;   // of an output the drawer reads at most
const HEX_BYTES = 256;            // of binary data it shows, as hex

// Tracebacks the reader opened, per task and attempt: a refill keeps them open.
const opened = new Set();

function isJson(contentType) {
  const media = (contentType || "").split(";")[0].trim().toLowerCase();
  return media === "application/json" || media.endsWith("+json");
}

function utf8Length(text) {
  return new TextEncoder().encode(text).length;
}

function bytesOf(b64) {
  const raw = atob(b64);
  const bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  return bytes;
}

function hexDump(bytes) {
  const lines = [];
  for (let at = 0; at < Math.min(bytes.length, HEX_BYTES); at += 16) {
    const row = Array.from(bytes.slice(at, Math.min(at + 16, HEX_BYTES)), (b) => b.toString(16).padStart(2, "0"));
    lines.push(at.toString(16).padStart(6, "0") + "  " + row.join(" "));
  }
  return lines.join("\n");
}

// What a preview shows: {text, note}. value: the parsed JSON when whole and
// JSON; text: the data as text (JSON or text/*, UTF-8); else b64: the bytes.
function render({value, text, b64, contentType, size, truncated}) {
  let body, shown;
  if (value !== undefined) {
    body = JSON.stringify(value, null, 2);
    shown = size;
  } else if (text !== undefined) {
    body = text;
    shown = utf8Length(text);
    if (!truncated && isJson(contentType)) {
      try { body = JSON.stringify(JSON.parse(text), null, 2); } catch (err) { /* shown as it is */ }
    }
  } else if (b64 !== undefined) {
    const bytes = bytesOf(b64);
    shown = bytes.length;
    const more = bytes.length > HEX_BYTES ? `\n… (${bytes.length - HEX_BYTES} more bytes as base64 only)` : "";
    body = `binary, ${size} bytes (${contentType})\n${hexDump(bytes)}${more}\n\nbase64: ${b64}`;
  } else {
    return {text: "", note: ""};
  }
  const note = truncated ? `truncated: ${shown} of ${size} bytes shown` : `${contentType}, ${size} bytes`;
  return {text: body, note};
}

function showPayload(task) {
  const holder = $("#drawer-payload");
  const note = holder.querySelector(".preview-note");
  const pre = holder.querySelector("pre");
  holder.dataset.state = "payload_size" in task ? (task.payload_truncated ? "truncated" : "whole") : "unknown";
  if (!("payload_size" in task)) {
    note.textContent = "not kept (the leader keeps a preview of the tasks it admitted: outputs.payload_preview_bytes)";
    pre.textContent = "";
    pre.hidden = true;
    return;
  }
  const shown = render({text: task.payload_text, b64: task.payload_b64, contentType: task.payload_content_type,
                        size: task.payload_size, truncated: task.payload_truncated});
  note.textContent = task.payload_size ? shown.note : "empty";
  pre.textContent = shown.text;
  pre.hidden = !task.payload_size;
}

async function showOutput(task) {
  const id = task.id;
  const holder = $("#drawer-output");
  const note = holder.querySelector(".preview-note");
  const result = $("#drawer-result");
  showTraceback(task);
  if (!TERMINAL.has(task.status)) {
    holder.dataset.state = "running";
    note.textContent = "";
    result.textContent = "(not finished)";
    return;
  }
  let r;
  try {
    r = await api(`/v1/tasks/${id}/result?timeout_s=0&max_bytes=${OUTPUT_BYTES}`);
  } catch (err) {
    if (app.drawerId !== id) return;
    result.textContent = "";
    note.textContent = "the result could not be read: " + err.message;
    return;
  }
  if (app.drawerId !== id) return;
  if (r.output_available) {
    holder.dataset.state = r.output_truncated ? "truncated" : "whole";
    const shown = render({value: r.output, text: r.output_text,
                          b64: "output" in r || "output_text" in r ? undefined : r.output_b64,
                          contentType: r.content_type, size: r.output_size, truncated: r.output_truncated});
    note.textContent = shown.note;
    result.textContent = shown.text;
  } else {
    holder.dataset.state = r.status === "succeeded" ? "not-kept" : "error";
    note.textContent = "";
    result.textContent = r.message || (r.status === "succeeded" ? "(no output kept)" : r.status);
  }
}

// The error's traceback: the latest attempt's, as its worker sent it.
function showTraceback(task) {
  const details = $("#drawer-traceback");
  const last = (task.attempts || []).filter((a) => a.traceback).pop();
  const failed = TERMINAL.has(task.status) && task.status !== "succeeded";
  const text = last && (failed || task.status === "retrying") ? last.traceback : "";
  details.hidden = !text;
  details.querySelector("pre").textContent = text;
  details.querySelector("summary").textContent = last ? `Traceback (attempt ${last.attempt})` : "Traceback";
}

function attemptTracebacks(task) {
  const byNumber = new Map((task.attempts || []).map((a) => [a.attempt, a]));
  for (const li of document.querySelectorAll("#drawer-attempts li")) {
    const a = byNumber.get(li.value);
    if (!a || !a.traceback) continue;
    const key = `${task.id}/${a.attempt}`;
    const details = document.createElement("details");
    details.className = "traceback";
    details.open = opened.has(key);
    details.addEventListener("toggle", () => { if (details.open) opened.add(key); else opened.delete(key); });
    const summary = document.createElement("summary");
    summary.textContent = "traceback";
    const pre = document.createElement("pre");
    pre.textContent = a.traceback;
    details.append(summary, pre);
    li.append(details);
  }
}

// The payload, the output or error and the tracebacks of the task read; a
// task just opened (task null): the previous one's go.
on("drawer", ({task}) => {
  if (task) {
    showPayload(task);
    attemptTracebacks(task);
    showOutput(task);
    return;
  }
  for (const holder of [$("#drawer-payload"), $("#drawer-output")]) {
    delete holder.dataset.state;
    holder.querySelector(".preview-note").textContent = "";
    holder.querySelector("pre").textContent = "";
  }
  $("#drawer-traceback").hidden = true;
});

// A row of the Events page opens its task's drawer.
$("#event-table tbody").addEventListener("click", (event) => {
  const row = event.target.closest("tr");
  if (row && row.dataset.id) openDrawer(row.dataset.id);
});
