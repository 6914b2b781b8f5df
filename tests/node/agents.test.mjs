// The @openai/agents JS SDK (RealtimeSession over its stock WebSocket transport) against a live
// server. Run by tests/test_node_agents.py, which starts the servers and sets:
//   S2S_REAL_URL      ws URL of /v1/realtime on a server with the real default models
//   S2S_SCRIPTED_URL  ws URL of /v1/realtime on a server with the scripted test backend
//   S2S_SPEECH_PCM    raw PCM16 24 kHz mono speech (the JFK recording)
//   S2S_BARGE_PCM     raw PCM16 24 kHz mono speech to interrupt with
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { RealtimeAgent, RealtimeSession, OpenAIRealtimeWebSocket, tool } from '@openai/agents/realtime';

const CHUNK = 24000 * 2 * 0.04; // 40 ms of PCM16 at 24 kHz
const SILENCE = new ArrayBuffer(24000 * 2 * 2); // 2 s

function pcm(path) {
  const bytes = readFileSync(path);
  return bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength);
}

async function stream(session, audio, pace = 0) {
  for (let i = 0; i < audio.byteLength; i += CHUNK) {
    session.sendAudio(audio.slice(i, i + CHUNK));
    if (pace) await new Promise((r) => setTimeout(r, pace));
  }
}

function until(session, predicate, timeoutMs = 120000) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('timed out waiting for an event')), timeoutMs);
    session.on('transport_event', (event) => {
      if (predicate(event)) {
        clearTimeout(timer);
        resolve(event);
      }
    });
  });
}

async function open(url, agent) {
  const session = new RealtimeSession(agent, {
    transport: new OpenAIRealtimeWebSocket(),
    model: 's2s-default',
    config: { audio: { input: { turnDetection: { type: 'server_vad', silenceDurationMs: 1500 } } } },
  });
  const events = [];
  session.on('transport_event', (event) => events.push(event));
  await session.connect({ apiKey: 'local', url });
  return { session, events };
}

test('a voice turn from a recording: transcript, spoken reply, completed', async () => {
  const { session, events } = await open(process.env.S2S_REAL_URL, new RealtimeAgent({ name: 'voice', instructions: 'Be brief.' }));
  const audioOut = [];
  session.on('audio', (event) => audioOut.push(event.data.byteLength));
  const done = until(session, (e) => e.type === 'response.done');
  await stream(session, pcm(process.env.S2S_SPEECH_PCM));
  await stream(session, SILENCE);
  const response = (await done).response;
  session.close();
  assert.equal(response.status, 'completed');
  const transcript = events.find((e) => e.type === 'conversation.item.input_audio_transcription.completed');
  assert.match(transcript.transcript.toLowerCase(), /ask not what your country can do for you/);
  assert.ok(audioOut.reduce((a, b) => a + b, 0) > 24000, 'at least 0.5 s of reply audio');
  const spoken = response.output[0].content[0].transcript;
  assert.ok(spoken.trim().length > 0);
  const types = events.map((e) => e.type);
  assert.ok(types.indexOf('input_audio_buffer.speech_stopped') < types.indexOf('response.created'));
});

test('an interruption: speech during the reply cancels it (turn_detected)', async () => {
  const { session } = await open(process.env.S2S_REAL_URL, new RealtimeAgent({ name: 'barge', instructions: 'Answer at length.' }));
  let interrupted = false;
  session.on('audio_interrupted', () => { interrupted = true; });
  const firstAudio = until(session, (e) => e.type === 'response.output_audio.delta');
  const cancelled = until(session, (e) => e.type === 'response.done' && e.response.status === 'cancelled');
  await stream(session, pcm(process.env.S2S_SPEECH_PCM));
  await stream(session, SILENCE);
  await firstAudio;
  await stream(session, pcm(process.env.S2S_BARGE_PCM), 10); // the user talks over the reply
  const done = await cancelled;
  session.close();
  assert.deepEqual(done.response.status_details, { type: 'cancelled', reason: 'turn_detected' });
  assert.ok(interrupted, 'the SDK reported audio_interrupted');
});

test('a tool call, its output and the follow-up response', async () => {
  const calls = [];
  const weather = tool({
    name: 'get_weather',
    description: 'Weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'], additionalProperties: false },
    strict: true,
    execute: async (args) => { calls.push(args); return '{"temp_c": 21}'; },
  });
  const { session } = await open(process.env.S2S_SCRIPTED_URL, new RealtimeAgent({ name: 'tools', instructions: 'Use tools.', tools: [weather] }));
  const followUp = until(session, (e) => e.type === 'response.done' && e.response.output[0]?.type === 'message');
  session.sendMessage('Weather in Paris?');
  const done = await followUp;
  session.close();
  assert.deepEqual(calls, [{ city: 'Paris' }]);
  const call = session.history.find((item) => item.type === 'function_call');
  assert.equal(call.name, 'get_weather');
  assert.match(done.response.output[0].content[0].transcript, /temp_c/);
});
