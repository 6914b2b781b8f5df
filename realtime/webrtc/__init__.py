"""The WebRTC transport of the Realtime protocol: a second transport beside the WebSocket's,
driving the same session (``realtime.session.lifecycle``).

``calls`` is the HTTP endpoint (``POST /v1/realtime/calls``: the SDP offer in, the answer out,
admission as for the WebSocket); ``call`` one call's transport (the data channel's events, the
WebRTC-only ``output_audio_buffer.*`` events, the hangup); ``media`` its audio (the microphone
track to PCM16, the reply track paced in real time); ``network`` the host candidates and ICE
servers. aiortc does ICE, DTLS, SRTP and Opus. It may import what the WebSocket transport
imports (the session, ``pool.access``, ``pool.conf``); the session imports nothing of it.
"""
