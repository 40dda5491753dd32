// test_container.mjs: dist/compose.yaml read as compose reads it (the npm
// yaml package, merge keys on, each ${VAR:-default} as its default), without
// Docker (run by test_container.sh, which passes the file and the --help
// texts of `convoy serve` and `convoy stage`):
// 1. it parses; one service runs `serve`, the others `stage`;
// 2. every variable under a service's environment is one that its command's
//    --help lists;
// 3. the head's CONVOY_NODES are `local`, then each stage service once, at
//    the port of its CONVOY_LISTEN;
// 4. every service's CONVOY_KEY_FILE is /run/secrets/NAME of a secret it
//    has and the file defines;
// 5. every CONVOY_MODEL lies in a folder the service mounts;
// 6. the head publishes its CONVOY_PORT; the build's Containerfile exists.
import { readFileSync, existsSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { parse } from 'yaml';
import { check, finish } from './checks.mjs';

const [composePath, serveHelpPath, stageHelpPath] = process.argv.slice(2);
const defaults = (v) => (typeof v === 'string' ? v.replace(/\$\{\w+:-([^}]*)\}/g, '$1') : String(v));
const helpVars = (path) => new Set([...readFileSync(path, 'utf8').matchAll(/^ +(CONVOY_\w+) /gm)].map((m) => m[1]));
const vars = { serve: helpVars(serveHelpPath), stage: helpVars(stageHelpPath) };

await finish(async () => {
  const doc = parse(readFileSync(composePath, 'utf8'), { merge: true });
  const services = Object.entries(doc?.services ?? {});
  const env = (svc) => Object.fromEntries(Object.entries(svc.environment ?? {}).map(([k, v]) => [k, defaults(v)]));
  const command = (svc) => [svc.command].flat()[0];
  const heads = services.filter(([, svc]) => command(svc) === 'serve');
  const stages = services.filter(([, svc]) => command(svc) === 'stage');
  check(heads.length === 1 && stages.length >= 1 && heads.length + stages.length === services.length,
    'compose.yaml parses: one service runs serve, the others stage', services.map(([n, s]) => [n, s.command]));
  check(vars.serve.size > 10 && vars.stage.size > 3, '--help lists the variables of serve and stage');

  for (const [name, svc] of services) {
    const unknown = Object.keys(env(svc)).filter((k) => !vars[command(svc)]?.has(k));
    check(unknown.length === 0, `${name}: convoy ${command(svc)} --help lists each of its variables`, unknown);
    const key = env(svc).CONVOY_KEY_FILE ?? '';
    const own = (svc.secrets ?? []).map((s) => (typeof s === 'string' ? s : s.source));
    const secret = key.replace(/^\/run\/secrets\//, '');
    check(key.startsWith('/run/secrets/') && own.includes(secret) && doc.secrets?.[secret]?.file,
      `${name}: CONVOY_KEY_FILE is a secret it has and the file defines`, { key, own });
    const model = env(svc).CONVOY_MODEL;
    const mounts = (svc.volumes ?? []).map((v) => (typeof v === 'string' ? defaults(v).split(':')[1] : v.target));
    if (model !== undefined)
      check(mounts.some((m) => model.startsWith(m.replace(/\/?$/, '/'))), `${name}: CONVOY_MODEL lies in a mount`,
        { model, mounts });
  }

  if (heads.length !== 1) return;
  const [headName, head] = heads[0];
  const nodes = (env(head).CONVOY_NODES ?? '').split(',');
  const listens = stages.map(([n, s]) => `${n}:${(env(s).CONVOY_LISTEN ?? '').split(':').pop()}`);
  check(nodes[0] === 'local' && nodes.slice(1).sort().join() === listens.sort().join(),
    `${headName}: CONVOY_NODES is local and every stage service at its CONVOY_LISTEN port`, { nodes, listens });
  const port = env(head).CONVOY_PORT ?? '8080';
  const published = (head.ports ?? []).map((p) => defaults(typeof p === 'string' ? p : `${p.target}`).split(':').pop());
  check(published.includes(port), `${headName}: its CONVOY_PORT ${port} is published`, published);
  const build = head.build ?? {};
  const containerfile = resolve(dirname(composePath), build.context ?? '.', build.dockerfile ?? 'Dockerfile');
  check(existsSync(containerfile), `${headName}: the build's Containerfile exists`, containerfile);
});
