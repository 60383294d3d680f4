// One transaction through Node's pg, as a Node service would write: the calls on
// stdin (JSON: {url, commit, calls: [{fn, args}]}) as SELECT poller_<fn>(name => $n …),
// then COMMIT or ROLLBACK. Prints {ids} or {error: {code, message, detail}}.
const { Client } = require("pg");

async function main() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  const job = JSON.parse(Buffer.concat(chunks).toString("utf8"));
  const client = new Client({ connectionString: job.url });
  await client.connect();
  const ids = [];
  try {
    await client.query("BEGIN");
    for (const call of job.calls) {
      const names = Object.keys(call.args);
      const named = names.map((name, i) => `${name} => $${i + 1}`).join(", ");
      const values = names.map((name) => call.args[name]);
      const result = await client.query(`SELECT poller_${call.fn}(${named}) AS id`, values);
      ids.push(Number(result.rows[0].id));
    }
    await client.query(job.commit ? "COMMIT" : "ROLLBACK");
    process.stdout.write(JSON.stringify({ ids }));
  } catch (err) {
    await client.query("ROLLBACK").catch(() => {});
    process.stdout.write(
      JSON.stringify({ error: { code: err.code, message: err.message, detail: err.detail } })
    );
  } finally {
    await client.end();
  }
}

main().catch((err) => {
  process.stderr.write(String(err && err.stack ? err.stack : err));
  process.exit(1);
});
