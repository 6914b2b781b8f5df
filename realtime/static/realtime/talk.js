// The browser client: microphone -> input_audio_buffer.append, response.output_audio.delta ->
// gapless playback, transcripts as they stream. Speaks the same OpenAI Realtime protocol as any
// other client; authenticates through the subprotocol when a key is given.
'use strict';

const OUTPUT_RATE = 24000;
const $ = (id) => document.getElementById(id);

// Read by the browser tests; also handy in the console.
const s2s = (window.s2s = {
  stats: { appends: 0, clientSecrets: 0, audioDeltas: 0, scheduledSamples: 0, userTranscripts: 0, assistantDeltas: 0, interruptions: 0,
           completed: 0 },
  events: [],
});

let ws = null;
let mic = null; // {context, stream, node}
let speaker = null; // {context, nextTime, sources: Set, itemId, itemStart}
let lastError = null;

function status(text, kind = 'info') {
  const el = $('status');
  el.textContent = text;
  el.dataset.kind = kind;
}

function line(role, text) {
  const p = document.createElement('p');
  p.className = `turn ${role}`;
  p.innerHTML = `<b>${role === 'user' ? 'You' : 'Agent'}:</b> <span></span>`;
  p.querySelector('span').textContent = text;
  $('transcript').appendChild(p);
  p.scrollIntoView({ block: 'end' });
  return p.querySelector('span');
}

function send(event) {
  if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(event));
}

function sessionSettings() {
  return {
    type: 'realtime',
    instructions: $('instructions').value,
    // The end-of-turn model decides when you have finished, not a fixed silence.
    audio: { input: { turn_detection: { type: 'semantic_vad' } }, output: { voice: $('voice').value } },
  };
}

// --- microphone --------------------------------------------------------------------------

function toBase64(buffer) {
  let binary = '';
  const bytes = new Uint8Array(buffer);
  for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(binary);
}

async function startMicrophone() {
  const stream = await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true },
  });
  const context = new AudioContext();
  await context.audioWorklet.addModule($('app').dataset.worklet);
  const node = new AudioWorkletNode(context, 'pcm16-capture');
  node.port.onmessage = ({ data }) => {
    $('level').value = Math.min(1, data.level * 4);
    send({ type: 'input_audio_buffer.append', audio: toBase64(data.pcm) });
    s2s.stats.appends += 1;
  };
  context.createMediaStreamSource(stream).connect(node);
  mic = { context, stream, node };
}

function stopMicrophone() {
  if (!mic) return;
  mic.stream.getTracks().forEach((track) => track.stop());
  mic.context.close();
  mic = null;
  $('level').value = 0;
}

// --- playback ----------------------------------------------------------------------------

function play(base64, itemId) {
  if (!speaker) speaker = { context: new AudioContext({ sampleRate: OUTPUT_RATE }), nextTime: 0, sources: new Set() };
  const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
  const pcm = new Int16Array(bytes.buffer, 0, bytes.length >> 1);
  const buffer = speaker.context.createBuffer(1, pcm.length, OUTPUT_RATE);
  const samples = buffer.getChannelData(0);
  for (let i = 0; i < pcm.length; i++) samples[i] = pcm[i] / 32768;
  const source = speaker.context.createBufferSource();
  source.buffer = buffer;
  source.connect(speaker.context.destination);
  const now = speaker.context.currentTime;
  if (speaker.itemId !== itemId || speaker.nextTime < now) {
    if (speaker.itemId !== itemId) {
      speaker.itemId = itemId;
      speaker.itemStart = Math.max(now, speaker.nextTime);
    }
    speaker.nextTime = Math.max(now + 0.05, speaker.nextTime); // a little slack keeps it gapless
  }
  source.start(speaker.nextTime);
  speaker.nextTime += buffer.duration;
  speaker.sources.add(source);
  source.onended = () => speaker && speaker.sources.delete(source);
  s2s.stats.scheduledSamples += pcm.length;
}

// Barge-in: stop what is playing at once and tell the server how much the user heard.
function stopPlayback() {
  if (!speaker || speaker.sources.size === 0) return;
  const heardMs = Math.max(0, Math.round((speaker.context.currentTime - speaker.itemStart) * 1000));
  speaker.sources.forEach((source) => source.stop());
  speaker.sources.clear();
  speaker.nextTime = 0;
  s2s.stats.interruptions += 1;
  if (speaker.itemId) {
    send({ type: 'conversation.item.truncate', item_id: speaker.itemId, content_index: 0, audio_end_ms: heardMs });
    speaker.itemId = null;
  }
}

// --- protocol ----------------------------------------------------------------------------

let agentLine = null;
const ERROR_TEXT = {
  session_limit_reached: 'Every voice unit is busy. Try again in a moment.',
  invalid_api_key: 'The API key was refused.',
  missing_api_key: 'This server needs an API key, or log in to this site.',
  login_required: 'Log in to this site to talk, or enter an API key.',
};

// A server that requires keys gives a logged-in user of its site a client secret instead
// (POST data-secret-url, realtime.client_secrets): the browser never holds an API key. The
// secret's session starts with the voice and instructions chosen here; its connect_url names the
// server process that holds the unit reserved for it.
async function clientSecret() {
  const csrf = document.cookie.split('; ').find((c) => c.startsWith('csrftoken='))?.split('=')[1];
  const reply = await fetch($('app').dataset.secretUrl, {
    method: 'POST',
    credentials: 'same-origin',
    headers: {'Content-Type': 'application/json', 'X-CSRFToken': csrf || ''},
    body: JSON.stringify({session: {instructions: $('instructions').value,
                                    audio: {output: {voice: $('voice').value}}}}),
  });
  const json = (reply.headers.get('Content-Type') || '').includes('application/json');
  const body = json ? await reply.json() : null;  // a proxy's or Django's error page is HTML
  if (!reply.ok) {
    throw Object.assign(new Error(body?.error?.message || `HTTP ${reply.status}`), {code: body?.error?.code});
  }
  return body;
}

function handle(event) {
  s2s.events.push(event.type);
  switch (event.type) {
    case 'session.created':
      status(`Connected (${event.session.id}). Speak when you like.`, 'ok');
      send({ type: 'session.update', session: sessionSettings() });
      break;
    case 'input_audio_buffer.speech_started':
      stopPlayback();
      status('Listening…', 'ok');
      break;
    case 'input_audio_buffer.speech_stopped':
      status('Thinking…', 'ok');
      break;
    case 'conversation.item.input_audio_transcription.completed':
      if (event.transcript) line('user', event.transcript);
      s2s.stats.userTranscripts += 1;
      break;
    case 'response.created':
      agentLine = null; // the line appears with the reply's first words
      break;
    case 'response.output_audio_transcript.delta':
    case 'response.output_text.delta':
      agentLine = agentLine || line('agent', '');
      agentLine.textContent += event.delta;
      s2s.stats.assistantDeltas += 1;
      break;
    case 'response.output_audio.delta':
      play(event.delta, event.item_id);
      s2s.stats.audioDeltas += 1;
      break;
    case 'response.done':
      if (event.response.status === 'cancelled') stopPlayback();
      if (event.response.status === 'completed') s2s.stats.completed += 1;
      status(`Response ${event.response.status}. Speak again when you like.`, 'ok');
      break;
    case 'error':
      lastError = event.error;
      status(ERROR_TEXT[event.error.code] || `Error ${event.error.code}: ${event.error.message}`, 'error');
      break;
  }
}

async function connect() {
  const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
  const protocols = ['realtime'];
  let url = `${scheme}://${location.host}${$('app').dataset.endpoint}`;
  const key = $('api-key').value.trim();
  lastError = null;
  if (key) {
    protocols.push(`openai-insecure-api-key.${key}`);
  } else if ($('app').dataset.keysRequired === 'true') {
    try {
      const secret = await clientSecret();
      protocols.push(`openai-insecure-api-key.${secret.value}`);
      url = secret.connect_url;
      s2s.stats.clientSecrets += 1;
    } catch (error) {
      status(ERROR_TEXT[error.code] || `No session: ${error.message}`, 'error');
      return;
    }
  }
  ws = new WebSocket(url, protocols);
  $('connect').disabled = true;
  status('Connecting…');
  ws.onmessage = (message) => handle(JSON.parse(message.data));
  ws.onopen = async () => {
    try {
      await startMicrophone();
      $('disconnect').disabled = false;
    } catch (error) {
      status(`No microphone: ${error.message}`, 'error');
      ws.close();
    }
  };
  ws.onclose = (close) => {
    stopMicrophone();
    stopPlayback();
    $('connect').disabled = false;
    $('disconnect').disabled = true;
    if (close.code === 1008) {
      status(ERROR_TEXT[lastError?.code] || `Refused: ${lastError?.message || 'policy violation'}`, 'error');
    } else if (!lastError) {
      status(`Disconnected (${close.code}).`);
    }
    ws = null;
  };
}

async function watchPool() {
  try {
    const health = await (await fetch($('app').dataset.health)).json();
    $('pool').textContent = `Pool: ${health.idle} of ${health.pool_size} units free`;
  } catch {
    $('pool').textContent = 'Pool: unreachable';
  }
}

$('connect').addEventListener('click', connect);
$('disconnect').addEventListener('click', () => ws && ws.close(1000));
$('apply').addEventListener('click', () => send({ type: 'session.update', session: sessionSettings() }));
$('voice').addEventListener('change', () => send({ type: 'session.update', session: sessionSettings() }));
watchPool();
setInterval(watchPool, 2000);
