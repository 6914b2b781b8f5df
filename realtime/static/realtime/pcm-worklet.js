// AudioWorklet: microphone float32 at the context's rate -> PCM16 mono at 24 kHz, in 40 ms chunks.
// Posts {pcm: ArrayBuffer, level: RMS of the chunk in [0, 1]} to the page.
const TARGET_RATE = 24000;
const CHUNK_SAMPLES = 960; // 40 ms at 24 kHz

class PCM16Capture extends AudioWorkletProcessor {
  constructor() {
    super();
    this.step = sampleRate / TARGET_RATE; // input samples per output sample
    this.position = 0; // fractional read position into the pending input
    this.pending = new Float32Array(0);
    this.out = new Int16Array(CHUNK_SAMPLES);
    this.filled = 0;
    this.energy = 0;
  }

  process(inputs) {
    const channel = inputs[0][0];
    if (!channel) return true;
    const input = new Float32Array(this.pending.length + channel.length);
    input.set(this.pending);
    input.set(channel, this.pending.length);
    // Linear interpolation between neighbouring samples: enough for speech into a 16 kHz VAD/STT.
    while (this.position + 1 < input.length) {
      const i = Math.floor(this.position);
      const frac = this.position - i;
      const sample = input[i] * (1 - frac) + input[i + 1] * frac;
      const clipped = Math.max(-1, Math.min(1, sample));
      this.out[this.filled++] = clipped < 0 ? clipped * 0x8000 : clipped * 0x7fff;
      this.energy += sample * sample;
      if (this.filled === CHUNK_SAMPLES) {
        this.port.postMessage({ pcm: this.out.buffer.slice(0), level: Math.sqrt(this.energy / CHUNK_SAMPLES) });
        this.filled = 0;
        this.energy = 0;
      }
      this.position += this.step;
    }
    const keep = Math.floor(this.position);
    this.pending = input.slice(keep);
    this.position -= keep;
    return true;
  }
}

registerProcessor('pcm16-capture', PCM16Capture);
