import { Client } from "@cronoq/client";

export async function demo(target: string, token?: string): Promise<string[]> {
  const client = new Client(target, { token });
  const lines: string[] = [];
  try {
    const sub = await client.submit({ n: 21, flaky: true }, { key: "job-21", wait: true });
    lines.push(JSON.stringify(sub.result?.json()));            // {"doubled":42,"attempt":2}
    const again = await client.submit({ n: 0 }, { key: "job-21" });
    lines.push(`${again.duplicate} ${again.id === sub.id}`);  // true true: the key named it
    const info = await client.get(sub.id);                     // ids are strings (BigInt works too)
    lines.push(info.attempts.map((a) => `${a.attempt}: ${a.status}`).join(", "));   // 1: retrying, 2: succeeded
    const bad = await client.submit({ text: "no number" });
    const failed = await client.wait(bad.id, { timeout: 30 });
    lines.push(`${failed.status}: ${failed.message}`);         // failed: the payload has no number n
    const page = await client.list({ statuses: ["succeeded"] });
    lines.push(page.tasks.map((task) => task.key).join(","));  // job-21
  } finally {
    client.close();
  }
  return lines;
}
