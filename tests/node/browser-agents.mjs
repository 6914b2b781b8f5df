// The browser build of @openai/agents' realtime API for tests/webrtc_browser.py: esbuild bundles
// this file into one script that sets window.agents (the page a stock browser app would be).
export { RealtimeAgent, RealtimeSession } from '@openai/agents/realtime';
