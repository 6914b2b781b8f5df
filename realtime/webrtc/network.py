"""Where a WebRTC call's media may go: the host addresses offered as ICE candidates
(``WEBRTC_HOST_ADDRESSES``) and the STUN/TURN servers (``WEBRTC_ICE_SERVERS``).

aiortc gathers its host candidates with ``aioice.ice.get_host_addresses``, which offers every
address of every interface except 127.0.0.1, and has no parameter to choose them. ``use_host_addresses``
replaces that function once per process with one that answers the configured list (or, with
none configured, aioice's own): an operator says which interface the media uses, and a test
offers 127.0.0.1 only, so that its traffic stays on loopback.
"""

import ipaddress

import aioice.ice
from aiortc import RTCConfiguration, RTCIceServer

_AIOICE_HOST_ADDRESSES = aioice.ice.get_host_addresses
_configured = []  # the addresses of WEBRTC_HOST_ADDRESSES; empty: aioice's own


def _host_addresses(use_ipv4, use_ipv6):
    """``aioice.ice.get_host_addresses``: the configured addresses of the families asked for."""
    if not _configured:
        return _AIOICE_HOST_ADDRESSES(use_ipv4, use_ipv6)
    return [a for a in _configured if (use_ipv4 if ipaddress.ip_address(a).version == 4 else use_ipv6)]


def use_host_addresses(addresses):
    """Offer exactly ``addresses`` (IP address strings; empty: every interface's, as aioice
    finds them) as host candidates, in every peer connection of this process from now on.
    Raises ValueError for a string that is not an IP address."""
    _configured[:] = [str(ipaddress.ip_address(a.strip())) for a in addresses if a.strip()]
    aioice.ice.get_host_addresses = _host_addresses


def configuration(ice_servers):
    """The ``RTCConfiguration`` of a peer connection: ``ice_servers`` as OpenAI's and the
    browser's ``iceServers`` (``[{"urls": "stun:...", "username", "credential"}]``)."""
    return RTCConfiguration(iceServers=[RTCIceServer(urls=s["urls"], username=s.get("username"),
                                                     credential=s.get("credential")) for s in ice_servers])

