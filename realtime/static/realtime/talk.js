// The browser client. Over WebRTC (the default, as OpenAI's browser SDK): the microphone is a
// track with the browser's echo cancellation, the reply plays from the answer's track, and the
// events go over the "oai-events" data channel. Where WebRTC cannot connect, over the WebSocket:
// microphone -> input_audio_buffer.append, response.output_audio.delta -> gapless playback. The
// same OpenAI Realtime protocol as any other client; transcripts as they stream.
'use strict';

const OUTPUT_RATE = 24000;
const $ = (id) => document.getElementById(id);

// Read by the browser tests; also handy in the console.
const s2s = (window.s2s = {
  stats: { appends: 0, clientSecrets: 0, audioDeltas: 0, scheduledSamples: 0, userTranscripts: 0, assistantDeltas: 0, interruptions: 0,
           completed: 0, playbackStarted: 0 },
  events: [],
  transport: null, // "webrtc" or "websocket", once connected
});

const WEBRTC_OPEN_SECONDS = 10; // then the page falls back to the WebSocket
let ws = null;
let rtc = null; // {pc, channel, stream, audio}
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
  if (rtc && rtc.channel.readyState === 'open') rtc.channel.send(JSON.stringify(event));
  else if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(event));
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
      stopPlayback(); // over WebRTC the server stops its track itself
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
    case 'output_audio_buffer.started':
      s2s.stats.playbackStarted += 1;
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

// The key the session is opened with, and where: an API key typed in, or a client secret for
// the logged-in user (its connect_url and calls_url name the process holding its unit), or none.
async function credentials() {
  const key = $('api-key').value.trim();
  const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
  const socketUrl = `${scheme}://${location.host}${$('app').dataset.endpoint}`;
  const where = { socketUrl, callsUrl: `${location.origin}${$('app').dataset.endpoint}/calls` };
  if (key) return { key, ...where };
  if ($('app').dataset.keysRequired !== 'true') return { key: null, ...where };
  const secret = await clientSecret();
  s2s.stats.clientSecrets += 1;
  return { key: secret.value, socketUrl: secret.connect_url, callsUrl: secret.calls_url };
}

async function connect() {
  lastError = null;
  $('connect').disabled = true;
  status('Connecting…');
  let auth;
  try {
    auth = await credentials();
  } catch (error) {
    status(ERROR_TEXT[error.code] || `No session: ${error.message}`, 'error');
    $('connect').disabled = false;
    return;
  }
  if (window.RTCPeerConnection && $('transport').value !== 'websocket') {
    try {
      await connectWebRTC(auth);
      return;
    } catch (error) {
      disconnected();
      if (error.code) { // refused (a full pool, a key): the WebSocket would be refused too
        status(ERROR_TEXT[error.code] || `Refused: ${error.message}`, 'error');
        $('connect').disabled = false;
        return;
      }
      $('transport-name').textContent = `WebSocket (WebRTC could not connect: ${error.message})`;
      try {
        if (error.spent && auth.key?.startsWith('ek_')) auth = await credentials(); // a secret opens one session
      } catch (refused) {
        status(ERROR_TEXT[refused.code] || `No session: ${refused.message}`, 'error');
        $('connect').disabled = false;
        return;
      }
    }
  }
  connectWebSocket(auth);
}

async function connectWebRTC(auth) {
  const pc = new RTCPeerConnection();
  const channel = pc.createDataChannel('oai-events');
  const stream = await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true },
  });
  const audio = new Audio();
  audio.autoplay = true;
  rtc = { pc, channel, stream, audio };
  pc.addTrack(stream.getAudioTracks()[0], stream);
  pc.ontrack = (event) => { audio.srcObject = event.streams[0] || new MediaStream([event.track]); };
  channel.onmessage = (message) => handle(JSON.parse(message.data));
  const opened = new Promise((resolve, reject) => {
    channel.onopen = resolve;
    setTimeout(() => reject(new Error(`no connection within ${WEBRTC_OPEN_SECONDS} s`)), WEBRTC_OPEN_SECONDS * 1000);
  });
  await pc.setLocalDescription(await pc.createOffer());
  const headers = { 'Content-Type': 'application/sdp' };
  if (auth.key) headers.Authorization = `Bearer ${auth.key}`;
  const reply = await fetch(auth.callsUrl, { method: 'POST', body: pc.localDescription.sdp, headers });
  if (!reply.ok) {
    const body = (reply.headers.get('Content-Type') || '').includes('application/json') ? await reply.json() : null;
    if (!body?.error?.code) throw new Error(`HTTP ${reply.status}`); // no such endpoint (an old server, a proxy)
    throw Object.assign(new Error(body.error.message), { code: body.error.code });
  }
  try {
    await pc.setRemoteDescription({ type: 'answer', sdp: await reply.text() });
    await opened;
  } catch (error) {
    throw Object.assign(error, { spent: true }); // the call was admitted: its secret is used
  }
  meterMicrophone(stream);
  s2s.transport = 'webrtc';
  $('transport-name').textContent = 'WebRTC';
  $('disconnect').disabled = false;
  channel.onclose = () => { disconnected(); status('Disconnected.'); };
  pc.onconnectionstatechange = () => {
    if (pc.connectionState === 'failed') { disconnected(); status('The connection was lost.', 'error'); }
  };
}

function connectWebSocket(auth) {
  const protocols = ['realtime'];
  if (auth.key) protocols.push(`openai-insecure-api-key.${auth.key}`);
  ws = new WebSocket(auth.socketUrl, protocols);
  ws.onmessage = (message) => handle(JSON.parse(message.data));
  ws.onopen = async () => {
    try {
      await startMicrophone();
      s2s.transport = 'websocket';
      if (!$('transport-name').textContent.startsWith('WebSocket')) $('transport-name').textContent = 'WebSocket';
      $('disconnect').disabled = false;
    } catch (error) {
      status(`No microphone: ${error.message}`, 'error');
      ws.close();
    }
  };
  ws.onclose = (close) => {
    disconnected();
    if (close.code === 1008) {
      status(ERROR_TEXT[lastError?.code] || `Refused: ${lastError?.message || 'policy violation'}`, 'error');
    } else if (!lastError) {
      status(`Disconnected (${close.code}).`);
    }
  };
}

// The microphone level meter over WebRTC (the WebSocket's worklet measures its own).
function meterMicrophone(stream) {
  const context = new AudioContext();
  const analyser = context.createAnalyser();
  context.createMediaStreamSource(stream).connect(analyser);
  const samples = new Float32Array(analyser.fftSize);
  const timer = setInterval(() => {
    if (!rtc) { clearInterval(timer); context.close(); return; }
    analyser.getFloatTimeDomainData(samples);
    $('level').value = Math.min(1, 4 * Math.sqrt(samples.reduce((sum, x) => sum + x * x, 0) / samples.length));
  }, 100);
}

function disconnected() {
  if (rtc) {
    rtc.stream.getTracks().forEach((track) => track.stop());
    rtc.pc.close();
    rtc.audio.srcObject = null;
    rtc = null;
  }
  stopMicrophone();
  stopPlayback();
  ws = null;
  $('connect').disabled = false;
  $('disconnect').disabled = true;
}

function hangUp() {
  if (ws) ws.close(1000);
  else if (rtc) { disconnected(); status('Disconnected.'); }
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
$('disconnect').addEventListener('click', hangUp);
$('apply').addEventListener('click', () => send({ type: 'session.update', session: sessionSettings() }));
$('voice').addEventListener('change', () => send({ type: 'session.update', session: sessionSettings() }));
watchPool();
setInterval(watchPool, 2000);
