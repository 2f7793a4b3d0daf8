// A reader of embedstream's output topic in Node.js (kafkajs, avsc), for any of the three output
// formats (EMBEDSTREAM_OUTPUT_FORMAT), told apart by the record itself:
//
//   avro           schemaless Avro; the `embedstream.schema` header is the CRC-64-AVRO fingerprint of the
//                  writer schema, one of the prefixes of schemas/embedding.avsc that a release wrote
//   avro-registry  Confluent's frame (a 0 byte, the schema id in 4 bytes), the schema from the registry
//   json           one JSON object with the same fields
//
// A null value is a tombstone: the document was deleted. A document's chunks arrive in order on one
// partition; a version is whole once `chunk_count` records with its `source_offset` came.
//
//   npm ci && BROKERS=localhost:9092 TOPIC=embeddings [REGISTRY_URL=http://localhost:8081] \
//     [SCHEMA=../../../schemas/embedding.avsc] [UNTIL_END=1] node reader.mjs
//
// Prints one JSON line per record (the decoded fields; a tombstone as {"deleted": true}) and, per
// whole version, a line {"whole": id, "source_offset": …, "chunks": n}. With UNTIL_END=1 it stops at
// the end offsets the topic had when it started (a batch job); else it follows the topic.

import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import avro from 'avsc';
import { Kafka, logLevel } from 'kafkajs';

const here = path.dirname(fileURLToPath(import.meta.url));
const env = process.env;
const topic = env.TOPIC ?? 'embeddings';
const registryUrl = env.REGISTRY_URL;
const schemaFile = env.SCHEMA ?? path.join(here, '..', '..', '..', 'schemas', 'embedding.avsc');

// How many of embedding.avsc's fields each release wrote, oldest first (schemas/codec.py's
// EMBEDDING_FIELD_HISTORY): every earlier writer schema is a prefix of the file's fields.
const FIELD_HISTORY = [11, 15, 17, 18];

// CRC-64-AVRO (Rabin) of a schema's Parsing Canonical Form, as the 8 bytes little-endian in hex.
const EMPTY = 0xc15d213aa4d7a795n;
const MASK = (1n << 64n) - 1n;
const TABLE = Array.from({ length: 256 }, (_, i) => {
  let fp = BigInt(i);
  for (let j = 0; j < 8; j++) fp = (fp >> 1n) ^ ((fp & 1n) ? EMPTY : 0n);
  return fp;
});
function fingerprint(type) {
  let fp = EMPTY;
  for (const b of Buffer.from(JSON.stringify(type.getSchema()), 'utf8')) {
    fp = ((fp >> 8n) ^ TABLE[Number((fp ^ BigInt(b)) & 0xffn)]) & MASK;
  }
  const out = Buffer.alloc(8);
  out.writeBigUInt64LE(fp);
  return out.toString('hex');
}

// The reader's schema (the file's), and each writer schema by its fingerprint, resolved to it.
const full = JSON.parse(fs.readFileSync(schemaFile, 'utf8'));
const reader = avro.Type.forSchema(full);
const writers = new Map();
for (const n of FIELD_HISTORY.filter((n) => n <= full.fields.length)) {
  const writer = avro.Type.forSchema({ ...full, fields: full.fields.slice(0, n) });
  writers.set(fingerprint(writer), n === full.fields.length ? null : reader.createResolver(writer));
}

const registered = new Map(); // schema id -> resolver to the reader's schema
async function fromRegistry(id) {
  if (!registered.has(id)) {
    if (!registryUrl) throw new Error(`record framed with schema id ${id}: set REGISTRY_URL`);
    const answer = await fetch(`${registryUrl}/schemas/ids/${id}`);
    if (!answer.ok) throw new Error(`registry answered ${answer.status} for schema id ${id}`);
    const writer = avro.Type.forSchema(JSON.parse((await answer.json()).schema));
    registered.set(id, reader.createResolver(writer));
  }
  return registered.get(id);
}

async function decode(value, headers) {
  const named = headers?.['embedstream.schema'];
  if (named !== undefined) {
    const fp = named.toString();
    if (!writers.has(fp)) throw new Error(`writer schema ${fp} is not one this reader knows: update ${schemaFile}`);
    const resolver = writers.get(fp);
    return ['avro', resolver ? reader.fromBuffer(value, resolver) : reader.fromBuffer(value)];
  }
  if (value[0] === 0 && value.length > 5) {
    return ['avro-registry', reader.fromBuffer(value.subarray(5), await fromRegistry(value.readInt32BE(1)))];
  }
  return ['json', JSON.parse(value.toString('utf8'))];
}

const kafka = new Kafka({ clientId: 'embedstream-reader', brokers: (env.BROKERS ?? 'localhost:9092').split(','),
                          logLevel: logLevel.WARN });
const admin = kafka.admin();
await admin.connect();
const ends = new Map((await admin.fetchTopicOffsets(topic)).map((p) => [p.partition, Number(p.high)]));
await admin.disconnect();
const untilEnd = env.UNTIL_END === '1';
const left = new Set([...ends].filter(([, high]) => high > 0).map(([p]) => p));

const consumer = kafka.consumer({ groupId: env.GROUP_ID ?? `embedstream-reader-${process.pid}-${Date.now()}` });
await consumer.connect();
await consumer.subscribe({ topic, fromBeginning: true });
const versions = new Map(); // `${id}@${source_offset}` -> chunks seen
let done;
const finished = new Promise((resolve) => { done = resolve; });
if (untilEnd && left.size === 0) done();

await consumer.run({
  eachMessage: async ({ partition, message }) => {
    const key = message.key?.toString('utf8') ?? null;
    const where = { partition, offset: Number(message.offset), key };
    if (message.value === null) {
      console.log(JSON.stringify({ ...where, deleted: true }));
    } else {
      const [format, rec] = await decode(message.value, message.headers);
      console.log(JSON.stringify({ ...where, format, ...rec }));
      const version = `${rec.id}@${rec.source_offset}`;
      const seen = (versions.get(version) ?? 0) + 1;
      versions.set(version, seen);
      if (seen === rec.chunk_count) {
        console.log(JSON.stringify({ whole: rec.id, source_offset: rec.source_offset, chunks: seen }));
        versions.delete(version);
      }
    }
    if (untilEnd && Number(message.offset) + 1 >= ends.get(partition)) {
      left.delete(partition);
      if (left.size === 0) done();
    }
  },
});
if (untilEnd) {
  await finished;
  await consumer.disconnect();
}
