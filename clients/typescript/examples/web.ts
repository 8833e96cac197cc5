import { WebClient } from "@cronoq/client/web";

// In a page: new WebClient("https://cronoq.example:7071", { token }); the page's
// origin must be in the server's [server.grpc_web] allowed_origins.
export async function fromPage(httpUrl: string, token: string): Promise<string[]> {
  const web = new WebClient(httpUrl, { token });
  const lines: string[] = [];
  const stop = new AbortController();
  const seen: string[] = [];
  const watching = (async () => {
    for await (const event of web.watch({ pools: ["default"], terminalOnly: true, signal: stop.signal })) {
      seen.push(`${event.id} ${event.status}`);
    }
  })();
  const sub = await web.submit({ n: 5 }, { key: "page-5" });
  const result = await web.wait(sub.id, { timeout: 30 });
  lines.push(JSON.stringify(result.json()));                  // {"doubled":10,"attempt":1}
  lines.push((await web.get({ key: "page-5" })).status);      // succeeded
  while (!seen.includes(`${sub.id} succeeded`)) await new Promise((r) => setTimeout(r, 20));
  lines.push("watched");                                      // the stream saw it finish
  stop.abort();
  await watching;
  return lines;
}
