-- softrdma_dgram.lua: Wireshark dissector for softrdma's iWARP over UDP.
--
-- The layout is the one in docs/datagram.md (softrdma's own extension, not a
-- standard): one DDP segment per UDP datagram, read in "datagram mode" (the
-- DDP control bits X and Q add words to the header, 0x0C is reserved),
-- followed by a CRC32C over everything before it, stored least-significant
-- octet first.
--
--   UD:  UDP payload = DDP header [T-MSN T-MO]X [DQPN]Q
--                      | RDMAP part (untagged only) | payload | CRC32C (4)
--   RD:  UDP payload = RD shim (26, octet 0 = 0x52) | [DDP segment as
--                      above, present iff flag D] | CRC32C (4)
--
-- The CRC covers everything before it (the shim included). The RD shim
-- (docs/datagram.md §9) is decoded field by field under "RD shim", its
-- receive rules (§9.3) checked, and the DDP segment behind it decoded as a
-- UD one; re-sent data datagrams (same flow, epoch and PSN as an earlier
-- frame) are marked as RD retransmissions.
--
-- Protocol "srdma"; every field is srdma.* (see the field table below).
--
-- Where it runs (tools/wireshark/README.md):
--   * on the UDP ports of the "Ports" preference (default 7174,18515), or the
--     range given as a script argument: -X lua_script1:port=5000-5010;
--   * anywhere else through the heuristic "srdma_udp", which claims a
--     datagram only if the CRC32C is right and either DV = 1, RV = 1, the
--     reserved DDP bits are 0 and X is not set on an untagged segment (UD),
--     or octet 0 is 0x52 and the datagram holds a whole shim (RD). Once it has claimed
--     a datagram, the rest of that UDP flow is dissected as on a configured
--     port ("Follow flows" preference), so a later corrupted datagram of the
--     flow is shown with a bad CRC instead of as plain data.
--
-- Verdicts: a good CRC is a plain field (srdma.crc_status == 1); a bad one
-- is an Error-level expert item in the Checksum group (srdma.crc_bad), so
-- `tshark -z expert` counts it. Header violations that make softrdma's
-- receiver drop the datagram (docs/datagram.md §4) are Error-level items
-- in the Malformed group (srdma.violation); with a bad CRC they are only
-- warnings (srdma.violation_unchecked), since the receiver counts such a
-- datagram as a CRC error and the corruption may be what broke the header.
-- The same holds for a frame captured only in part (CRC "Unverified").
--
-- Requires Wireshark 3.x/4.x (Lua 5.2 with bit32). Tested with tshark 4.0.17.

-- Loaded twice (an installed copy in a plugin folder and -X lua_script)?
-- Wireshark loads plugin folders first; a second Proto("srdma") would fail,
-- so the later copy steps aside and says so.
local THIS_FILE = ((debug and debug.getinfo(1, "S").source) or "?"):gsub("^@", "")
if rawget(_G, "softrdma_dgram_loaded_from") ~= nil then
    report_failure("softrdma_dgram.lua is already loaded from "
        .. tostring(rawget(_G, "softrdma_dgram_loaded_from")) .. "; the copy at "
        .. THIS_FILE .. " and its arguments are ignored. Keep only one of them.")
    return
end
rawset(_G, "softrdma_dgram_loaded_from", THIS_FILE)

local bit = bit32
local band, bxor, rshift = bit.band, bit.bxor, bit.rshift

-- -------------------------------------------------------------------------
-- Script arguments: -X lua_script1:port=RANGE  -X lua_script1:builtin=0|1
--                   -X lua_script1:follow=0|1
-- They set the preferences' defaults (a value saved in the user's
-- preferences file still wins, as for any preference default).
-- -------------------------------------------------------------------------

local DEFAULT_PORTS = "7174,18515"
local arg_ports, arg_builtin, arg_follow = nil, nil, nil
for _, a in ipairs({ ... }) do
    local k, v = tostring(a):match("^%s*([%w_]+)%s*=%s*(.-)%s*$")
    if k == "port" or k == "ports" then
        arg_ports = v
    elseif k == "builtin" then
        arg_builtin = (v == "1" or v == "true" or v == "TRUE")
    elseif k == "follow" then
        arg_follow = (v == "1" or v == "true" or v == "TRUE")
    end
end

local srdma = Proto("srdma", "softrdma iWARP over UDP")

srdma.prefs.ports = Pref.range("Ports", arg_ports or DEFAULT_PORTS,
    "UDP ports dissected as softrdma datagrams (heuristics find them on other ports)", 65535)
srdma.prefs.follow = Pref.bool("Follow flows", arg_follow == nil and true or arg_follow,
    "After the heuristic recognises a datagram, dissect the rest of its UDP flow "
    .. "as softrdma too (so corrupted datagrams are shown with a bad CRC)")
srdma.prefs.builtin = Pref.bool("Also show Wireshark's iWARP DDP/RDMAP decode",
    arg_builtin == nil and true or arg_builtin,
    "Hand segments without extension bits (X = Q = 0, standard opcode) to "
    .. "Wireshark's own iwarp_ddp_rdmap dissector as well")

-- -------------------------------------------------------------------------
-- CRC32C (Castagnoli, reflected polynomial 0x82F63B78), table driven.
-- crc = 0xFFFFFFFF; per octet b: crc = (crc >> 8) ^ T[(crc ^ b) & 0xFF];
-- result crc ^ 0xFFFFFFFF (RFC 3720). Check value: "123456789" -> 0xE3069283.
-- -------------------------------------------------------------------------

local CRC_TABLE = {}
for n = 0, 255 do
    local c = n
    for _ = 1, 8 do
        if band(c, 1) ~= 0 then
            c = bxor(rshift(c, 1), 0x82F63B78)
        else
            c = rshift(c, 1)
        end
    end
    CRC_TABLE[n] = c
end

local function crc32c_string(s)
    local crc = 0xFFFFFFFF
    local len = #s
    local i = 1
    while i <= len do
        local j = i + 3999
        if j > len then j = len end
        local bytes = { s:byte(i, j) }
        for k = 1, #bytes do
            crc = bxor(rshift(crc, 8), CRC_TABLE[band(bxor(crc, bytes[k]), 0xFF)])
        end
        i = j + 1
    end
    return bxor(crc, 0xFFFFFFFF)
end

assert(crc32c_string("123456789") == 0xE3069283, "srdma: CRC32C self-test failed")

local function crc32c_tvb(tvb, offset, length)
    if length <= 0 then return crc32c_string("") end
    return crc32c_string(tvb:raw(offset, length))
end

-- -------------------------------------------------------------------------
-- Names
-- -------------------------------------------------------------------------

local OPCODE_NAMES = {
    [0x0] = "RDMA Write",
    [0x1] = "RDMA Read Request",
    [0x2] = "RDMA Read Response",
    [0x3] = "Send",
    [0x4] = "Send with Invalidate",
    [0x5] = "Send with Solicited Event",
    [0x6] = "Send with SE and Invalidate",
    [0x7] = "Terminate",
    [0x8] = "Immediate Data",
    [0x9] = "Immediate Data with SE",
    [0xA] = "Atomic Request",
    [0xB] = "Atomic Response",
    [0xC] = "RDMA Write-Record",
    [0xD] = "Reserved (0xD)",
    [0xE] = "Reserved (0xE)",
    [0xF] = "Reserved (0xF)",
}

-- Short names for the Info column.
local OPCODE_SHORT = {
    [0x0] = "Write", [0x1] = "Read Request", [0x2] = "Read Response",
    [0x3] = "Send", [0x4] = "Send+Inv", [0x5] = "Send+SE", [0x6] = "Send+SE+Inv",
    [0x7] = "Terminate", [0x8] = "Immediate", [0x9] = "Immediate+SE",
    [0xA] = "Atomic Request", [0xB] = "Atomic Response", [0xC] = "Write-Record",
}

-- Which opcodes are tagged (docs/datagram.md §4 rule 5) and their queue.
local TAGGED_OP = { [0x0] = true, [0x2] = true, [0xC] = true }
local QUEUE_OF = {
    [0x1] = 1, [0x3] = 0, [0x4] = 0, [0x5] = 0, [0x6] = 0, [0x7] = 2,
    [0x8] = 0, [0x9] = 0, [0xA] = 1, [0xB] = 3,
}
-- Opcode parts with a fixed length that must be the whole segment.
local EXACT_PART = { [0x1] = 28, [0x8] = 8, [0x9] = 8, [0xA] = 52, [0xB] = 12 }

local QN_NAMES = {
    [0] = "Send/Immediate queue",
    [1] = "Read/Atomic Request queue",
    [2] = "Terminate queue",
    [3] = "Atomic Response queue",
}

local ATOMIC_OP_NAMES = { [0] = "Fetch and Add", [1] = "Swap", [2] = "Compare and Swap" }

local LAYER_NAMES = { [0] = "RDMAP", [1] = "DDP", [2] = "LLP (MPA / datagram framing)" }

local ETYPE_NAMES = {
    [0] = { [0] = "Local Catastrophic", [1] = "Remote Protection", [2] = "Remote Operation" },
    [1] = { [0] = "Local Catastrophic", [1] = "Tagged Buffer", [2] = "Untagged Buffer",
            [3] = "Reserved for the LLP" },
    [2] = { [0] = "MPA / LLP error" },
}

-- (layer, etype, code) -> description; the Terminate code tables of
-- RFC 5040 §7, RFC 5041 §7 and RFC 5044 §8.
local TERM_CODES = {
    [0] = {
        [0] = { [0x00] = "local catastrophic error" },
        [1] = {
            [0x00] = "invalid STag", [0x01] = "base or bounds violation",
            [0x02] = "access rights violation",
            [0x03] = "STag not associated with RDMAP stream", [0x04] = "TO wrap",
            [0x09] = "STag cannot be invalidated", [0xFF] = "unspecified error",
        },
        [2] = {
            [0x05] = "invalid RDMAP version", [0x06] = "unexpected opcode",
            [0x07] = "catastrophic error, local to stream",
            [0x08] = "catastrophic error, global", [0x09] = "STag cannot be invalidated",
            [0xFF] = "unspecified error",
        },
    },
    [1] = {
        [0] = { [0x00] = "local catastrophic error" },
        [1] = {
            [0x00] = "invalid STag", [0x01] = "base or bounds violation",
            [0x02] = "STag not associated with DDP stream", [0x03] = "TO wrap",
            [0x04] = "invalid DDP version",
        },
        [2] = {
            [0x01] = "invalid QN", [0x02] = "invalid MSN, no buffer available",
            [0x03] = "invalid MSN, MSN range is not valid", [0x04] = "invalid MO",
            [0x05] = "DDP message too long for available buffer",
            [0x06] = "invalid DDP version",
        },
    },
    [2] = {
        [0] = {
            [0x01] = "TCP connection closed or lost", [0x02] = "CRC error",
            [0x03] = "marker and ULPDU length mismatch",
            [0x04] = "invalid MPA Request or Reply", [0x05] = "local catastrophic error",
            [0x06] = "insufficient IRD resources", [0x07] = "no matching RTR option",
        },
    },
}

local function term_description(layer, etype, code)
    local l = TERM_CODES[layer]
    local e = l and l[etype]
    local c = e and e[code]
    local ln = LAYER_NAMES[layer] or string.format("layer %d", layer)
    local en = (ETYPE_NAMES[layer] and ETYPE_NAMES[layer][etype]) or string.format("type %d", etype)
    return string.format("%s / %s / %s", ln, en, c or string.format("unknown code 0x%02x", code))
end

-- -------------------------------------------------------------------------
-- Fields
-- -------------------------------------------------------------------------

local F = {}
local function add_field(key, field)
    F[key] = field
end

local CRC_STATUS = { [0] = "Bad", [1] = "Good", [2] = "Unverified" }

-- The two control octets. The same set is built again under srdma.term.ddp.*
-- for the DDP header a Terminate echoes.
local function control_fields(prefix, key)
    add_field(key .. "ddp_ctrl", ProtoField.uint8(prefix .. "ddp_ctrl", "DDP control", base.HEX))
    add_field(key .. "t", ProtoField.bool(prefix .. "t", "T (tagged)", 8, nil, 0x80))
    add_field(key .. "l", ProtoField.bool(prefix .. "l", "L (last segment)", 8, nil, 0x40))
    add_field(key .. "x", ProtoField.bool(prefix .. "x", "X (T-MSN and T-MO follow)", 8, nil, 0x20))
    add_field(key .. "q", ProtoField.bool(prefix .. "q", "Q (DQPN follows)", 8, nil, 0x10))
    add_field(key .. "ddp_rsvd", ProtoField.uint8(prefix .. "ddp_rsvd", "Reserved", base.HEX, nil, 0x0C))
    add_field(key .. "dv", ProtoField.uint8(prefix .. "dv", "DV (DDP version)", base.DEC, nil, 0x03))
    add_field(key .. "rdmap_ctrl", ProtoField.uint8(prefix .. "rdmap_ctrl", "RDMAP control", base.HEX))
    add_field(key .. "rv", ProtoField.uint8(prefix .. "rv", "RV (RDMAP version)", base.DEC, nil, 0xC0))
    add_field(key .. "rdmap_rsvd", ProtoField.uint8(prefix .. "rdmap_rsvd", "Reserved", base.HEX, nil, 0x30))
    add_field(key .. "opcode", ProtoField.uint8(prefix .. "opcode", "Opcode", base.HEX, OPCODE_NAMES, 0x0F))
    add_field(key .. "stag", ProtoField.uint32(prefix .. "stag", "STag", base.HEX))
    add_field(key .. "to", ProtoField.uint64(prefix .. "to", "Tagged offset", base.HEX))
    add_field(key .. "rsvdulp", ProtoField.uint32(prefix .. "rsvdulp", "RsvdULP", base.HEX))
    add_field(key .. "inval_stag", ProtoField.uint32(prefix .. "inval_stag", "Invalidate STag", base.HEX))
    add_field(key .. "qn", ProtoField.uint32(prefix .. "qn", "Queue number", base.DEC, QN_NAMES))
    add_field(key .. "msn", ProtoField.uint32(prefix .. "msn", "Message sequence number", base.DEC))
    add_field(key .. "mo", ProtoField.uint32(prefix .. "mo", "Message offset", base.DEC))
end

-- Read Request part (also the RDMAP header a Terminate echoes).
local function read_request_fields(prefix, key)
    add_field(key .. "sink_stag", ProtoField.uint32(prefix .. "sink_stag", "Data sink STag", base.HEX))
    add_field(key .. "sink_to", ProtoField.uint64(prefix .. "sink_to", "Data sink tagged offset", base.HEX))
    add_field(key .. "size", ProtoField.uint32(prefix .. "size", "RDMA Read message size", base.DEC))
    add_field(key .. "src_stag", ProtoField.uint32(prefix .. "src_stag", "Data source STag", base.HEX))
    add_field(key .. "src_to", ProtoField.uint64(prefix .. "src_to", "Data source tagged offset", base.HEX))
end

control_fields("srdma.", "")
add_field("tmsn", ProtoField.uint32("srdma.tmsn", "T-MSN (tagged message sequence number)", base.DEC))
add_field("tmo", ProtoField.uint32("srdma.tmo", "T-MO (offset in the tagged message)", base.DEC))
add_field("base_to", ProtoField.uint64("srdma.base_to", "Base tagged offset of the message (TO - T-MO)", base.HEX))
add_field("dqpn", ProtoField.uint32("srdma.dqpn", "DQPN (destination QP number)", base.HEX_DEC))
add_field("hdr_len", ProtoField.uint32("srdma.hdr_len", "Header length", base.DEC))
add_field("rr", ProtoField.bytes("srdma.rr", "RDMA Read Request"))
read_request_fields("srdma.rr.", "rr_")
add_field("atomic", ProtoField.bytes("srdma.atomic", "Atomic Request"))
add_field("atomic_opword", ProtoField.uint32("srdma.atomic.opcode", "Atomic operation", base.DEC, ATOMIC_OP_NAMES, 0x0000000F))
add_field("atomic_rsvd", ProtoField.uint32("srdma.atomic.rsvd", "Reserved", base.HEX, nil, 0xFFFFFFF0))
add_field("atomic_req_id", ProtoField.uint32("srdma.atomic.req_id", "Request identifier", base.HEX_DEC))
add_field("atomic_stag", ProtoField.uint32("srdma.atomic.stag", "Remote STag", base.HEX))
add_field("atomic_to", ProtoField.uint64("srdma.atomic.to", "Remote tagged offset", base.HEX))
add_field("atomic_add_swap", ProtoField.uint64("srdma.atomic.add_swap", "Add or swap data", base.HEX))
add_field("atomic_add_swap_mask", ProtoField.uint64("srdma.atomic.add_swap_mask", "Add or swap mask", base.HEX))
add_field("atomic_compare", ProtoField.uint64("srdma.atomic.compare", "Compare data", base.HEX))
add_field("atomic_compare_mask", ProtoField.uint64("srdma.atomic.compare_mask", "Compare mask", base.HEX))
add_field("atomic_resp", ProtoField.bytes("srdma.atomic_resp", "Atomic Response"))
add_field("atomic_orig_req_id", ProtoField.uint32("srdma.atomic.orig_req_id", "Original request identifier", base.HEX_DEC))
add_field("atomic_orig_value", ProtoField.uint64("srdma.atomic.orig_value", "Original remote data value", base.HEX))
add_field("immediate", ProtoField.uint64("srdma.immediate", "Immediate data", base.HEX))
add_field("term", ProtoField.bytes("srdma.term", "Terminate"))
add_field("term_ctrl", ProtoField.uint32("srdma.term.ctrl", "Terminate control", base.HEX))
add_field("term_layer", ProtoField.uint8("srdma.term.layer", "Layer", base.DEC, LAYER_NAMES, 0xF0))
add_field("term_etype", ProtoField.uint8("srdma.term.etype", "Error type", base.DEC, nil, 0x0F))
add_field("term_code", ProtoField.uint8("srdma.term.code", "Error code", base.HEX))
add_field("term_m", ProtoField.bool("srdma.term.m", "M (segment length valid)", 16, nil, 0x8000))
add_field("term_d", ProtoField.bool("srdma.term.d", "D (DDP header attached)", 16, nil, 0x4000))
add_field("term_r", ProtoField.bool("srdma.term.r", "R (RDMAP header attached)", 16, nil, 0x2000))
add_field("term_rsvd", ProtoField.uint16("srdma.term.rsvd", "Reserved", base.HEX, nil, 0x1FFF))
add_field("term_cause", ProtoField.string("srdma.term.cause", "Cause"))
add_field("term_seg_len", ProtoField.uint16("srdma.term.seg_len", "DDP segment length", base.DEC))
add_field("term_ddp", ProtoField.bytes("srdma.term.ddp", "Terminated DDP header"))
control_fields("srdma.term.ddp.", "term_ddp_")
add_field("term_rdmap", ProtoField.bytes("srdma.term.rdmap", "Terminated RDMAP header"))
read_request_fields("srdma.term.rdmap.", "term_rr_")
add_field("payload", ProtoField.bytes("srdma.payload", "Payload"))
add_field("payload_len", ProtoField.uint32("srdma.payload_len", "Payload length", base.DEC))
-- The RD shim (docs/datagram.md §9.2), names as there.
local RD_FLAG_NAMES = { D = 0x80, S = 0x40, A = 0x20, N = 0x10, R = 0x08, P = 0x04 }
add_field("rd", ProtoField.bytes("srdma.rd", "RD shim"))
add_field("rd_magic", ProtoField.uint8("srdma.rd.magic", "Magic / shim version (0x52 = 'R', version 1)", base.HEX))
add_field("rd_dqpn", ProtoField.uint24("srdma.rd.dqpn", "DQPN (destination QP number)", base.HEX_DEC))
add_field("rd_flags", ProtoField.uint8("srdma.rd.flags", "Flags", base.HEX))
add_field("rd_d", ProtoField.bool("srdma.rd.d", "D (a DDP segment follows; epoch and PSN valid)", 8, nil, 0x80))
add_field("rd_s", ProtoField.bool("srdma.rd.s", "S (SYN: the session is not yet acknowledged)", 8, nil, 0x40))
add_field("rd_a", ProtoField.bool("srdma.rd.a", "A (cumulative ACK)", 8, nil, 0x20))
add_field("rd_n", ProtoField.bool("srdma.rd.n", "N (NAK: ack PSN is missing, resend from it)", 8, nil, 0x10))
add_field("rd_r", ProtoField.bool("srdma.rd.r", "R (reset: no session ack epoch here; ack PSN = epoch floor)", 8, nil, 0x08))
add_field("rd_p", ProtoField.bool("srdma.rd.p", "P (poll: answer with an ACK at once)", 8, nil, 0x04))
add_field("rd_rsvd", ProtoField.uint8("srdma.rd.rsvd", "Reserved", base.HEX, nil, 0x03))
add_field("rd_sqpn", ProtoField.uint24("srdma.rd.sqpn", "SQPN (source QP number)", base.HEX_DEC))
add_field("rd_epoch", ProtoField.uint32("srdma.rd.epoch", "Epoch (sender's session)", base.HEX_DEC))
add_field("rd_psn", ProtoField.uint32("srdma.rd.psn", "PSN", base.DEC))
add_field("rd_ack_epoch", ProtoField.uint32("srdma.rd.ack_epoch", "Ack epoch", base.HEX_DEC))
add_field("rd_ack_psn", ProtoField.uint32("srdma.rd.ack_psn", "Ack PSN (next PSN expected)", base.DEC))
add_field("rd_floor", ProtoField.uint32("srdma.rd.floor", "Epoch floor (in the ack PSN field)", base.HEX_DEC))
add_field("rd_window", ProtoField.uint16("srdma.rd.window", "Window (data datagrams the sender of this shim accepts)", base.DEC))
add_field("rd_kind", ProtoField.string("srdma.rd.kind", "RD datagram kind"))
add_field("rd_retransmission", ProtoField.bool("srdma.rd.retransmission", "Retransmission"))
add_field("rd_first_frame", ProtoField.framenum("srdma.rd.first_frame", "First sent in frame"))
add_field("shim", ProtoField.bytes("srdma.shim", "Unknown shim version (not decoded)"))
add_field("undecoded", ProtoField.bytes("srdma.undecoded", "Undecoded octets"))
add_field("crc", ProtoField.uint32("srdma.crc", "CRC32C", base.HEX))
add_field("crc_computed", ProtoField.uint32("srdma.crc_computed", "Computed CRC32C", base.HEX))
add_field("crc_status", ProtoField.uint8("srdma.crc_status", "CRC status", base.DEC, CRC_STATUS))

do
    local list = {}
    for _, f in pairs(F) do list[#list + 1] = f end
    srdma.fields = list
end

local E = {
    crc_bad = ProtoExpert.new("srdma.crc_bad", "Bad CRC32C",
        expert.group.CHECKSUM, expert.severity.ERROR),
    violation = ProtoExpert.new("srdma.violation",
        "softrdma receiver drops this datagram",
        expert.group.MALFORMED, expert.severity.ERROR),
    violation_unchecked = ProtoExpert.new("srdma.violation_unchecked",
        "Header violation in a datagram whose CRC is bad or unverified",
        expert.group.MALFORMED, expert.severity.WARN),
    protocol = ProtoExpert.new("srdma.protocol", "Unusual value for this opcode",
        expert.group.PROTOCOL, expert.severity.WARN),
    undecoded = ProtoExpert.new("srdma.undecoded.expert", "Not decoded",
        expert.group.UNDECODED, expert.severity.NOTE),
    crc_unverified = ProtoExpert.new("srdma.crc_unverified",
        "CRC32C not verified: the frame was captured only in part",
        expert.group.CHECKSUM, expert.severity.NOTE),
    rd_retransmission = ProtoExpert.new("srdma.rd.retransmission.expert",
        "RD retransmission", expert.group.SEQUENCE, expert.severity.NOTE),
    rd_nak = ProtoExpert.new("srdma.rd.nak.expert", "RD NAK (a datagram was lost)",
        expert.group.SEQUENCE, expert.severity.NOTE),
    rd_reset = ProtoExpert.new("srdma.rd.reset.expert", "RD reset (no such session)",
        expert.group.SEQUENCE, expert.severity.NOTE),
}
srdma.experts = { E.crc_bad, E.violation, E.violation_unchecked, E.protocol,
                  E.undecoded, E.crc_unverified, E.rd_retransmission, E.rd_nak,
                  E.rd_reset }

local ddp_rdmap = Dissector.get("iwarp_ddp_rdmap")

-- -------------------------------------------------------------------------
-- Helpers
-- -------------------------------------------------------------------------

-- What the first octets say, without touching the tree.
local function header_flags(c0, c1)
    return {
        t = band(c0, 0x80) ~= 0,
        l = band(c0, 0x40) ~= 0,
        x = band(c0, 0x20) ~= 0,
        q = band(c0, 0x10) ~= 0,
        rsvd = band(c0, 0x0C),
        dv = band(c0, 0x03),
        rv = rshift(c1, 6),
        rdmap_rsvd = band(c1, 0x30),
        opcode = band(c1, 0x0F),
    }
end

-- Length of the DDP header (extension words and DQPN included) the control
-- octet announces in datagram mode: 14 / 18, +8 for X on a tagged segment,
-- +4 for Q.
local function ddp_header_len(h)
    local n = h.t and 14 or 18
    if h.t and h.x then n = n + 8 end
    if h.q then n = n + 4 end
    return n
end

local function hex8(v) return string.format("0x%08x", v) end

-- -------------------------------------------------------------------------
-- The RD shim (docs/datagram.md §9)
--
--  0        1                          4        5                          8
-- +--------+--------------------------+--------+--------------------------+
-- |  0x52  |        DQPN (24)         | flags  |        SQPN (24)         |
-- +--------+--------------------------+--------+--------------------------+
--  8        12       16          20          24       26
-- | epoch  |  PSN   | ack epoch | ack PSN /  | window |
-- |  (D)   |  (D)   |  (A or R) | floor (R)  |  (16)  |
--
-- flags D 0x80, S 0x40, A 0x20, N 0x10, R 0x08, P 0x04, reserved 0x03.
-- -------------------------------------------------------------------------

local RD_MAGIC = 0x52
local RD_SHIM_LEN = 26

-- First frame of every (flow, epoch, PSN) data datagram seen, to mark
-- retransmissions. Filled on the first pass over the capture.
local rd_first_seen = {}

function srdma.init()
    rd_first_seen = {}
end

local function rd_flag_string(flags)
    local out = {}
    for _, n in ipairs({ "D", "S", "A", "N", "R", "P" }) do
        if band(flags, RD_FLAG_NAMES[n]) ~= 0 then out[#out + 1] = n end
    end
    return #out > 0 and table.concat(out, ",") or "none"
end

-- Decodes the shim at octet 0 (the caller saw octet 0 & 0x03 == 0b10).
-- `seg_end` is where the CRC starts (or the capture ends), `real_end` where
-- the CRC would start. Returns (ok, has_segment, info): ok = false when the
-- receiver would drop the datagram at the shim (the segment is then not
-- decoded); has_segment when a DDP segment follows.
local function dissect_rd_shim(tvb, pinfo, tree, seg_end, real_end, crc_state)
    local c0 = tvb(0, 1):uint()
    local function report(text)
        if crc_state ~= "good" then
            tree:add_proto_expert_info(E.violation_unchecked, text)
        else
            tree:add_proto_expert_info(E.violation, text)
        end
    end
    if c0 ~= RD_MAGIC then
        tree:add(F.shim, tvb(0, seg_end))
        report(string.format("octet 0 = 0x%02x: an RD shim version other than 0x52 (BadVersion)", c0))
        return false, false, string.format("RD shim version 0x%02x", c0)
    end
    if seg_end < RD_SHIM_LEN then
        tree:add(F.undecoded, tvb(0, seg_end))
        if real_end < RD_SHIM_LEN then
            report(string.format("shorter than the %d-octet RD shim (Truncated)", RD_SHIM_LEN))
        end
        return false, false, "RD [truncated]"
    end
    local flags = tvb(4, 1):uint()
    local d = band(flags, 0x80) ~= 0
    local syn = band(flags, 0x40) ~= 0
    local a = band(flags, 0x20) ~= 0
    local n = band(flags, 0x10) ~= 0
    local r = band(flags, 0x08) ~= 0
    local p = band(flags, 0x04) ~= 0
    local rsvd = band(flags, 0x03)
    local dqpn = tvb(1, 3):uint()
    local sqpn = tvb(5, 3):uint()
    local epoch = tvb(8, 4):uint()
    local psn = tvb(12, 4):uint()
    local ack_epoch = tvb(16, 4):uint()
    local ack_psn = tvb(20, 4):uint()
    local window = tvb(24, 2):uint()

    local kind
    if d then
        kind = "data"
    elseif r then
        kind = "reset"
    elseif n then
        kind = "NAK"
    elseif a then
        kind = "ACK"
    elseif p then
        kind = "probe"
    else
        kind = "window update"
    end

    local st = tree:add(F.rd, tvb(0, RD_SHIM_LEN))
    st:set_text(string.format("RD shim: %s, %s -> %s, flags %s", kind,
        string.format("SQPN 0x%06x", sqpn), string.format("DQPN 0x%06x", dqpn),
        rd_flag_string(flags)))
    st:add(F.rd_magic, tvb(0, 1))
    st:add(F.rd_dqpn, tvb(1, 3))
    local ft = st:add(F.rd_flags, tvb(4, 1))
    ft:append_text(" (" .. rd_flag_string(flags) .. ")")
    ft:add(F.rd_d, tvb(4, 1))
    ft:add(F.rd_s, tvb(4, 1))
    ft:add(F.rd_a, tvb(4, 1))
    ft:add(F.rd_n, tvb(4, 1))
    ft:add(F.rd_r, tvb(4, 1))
    ft:add(F.rd_p, tvb(4, 1))
    ft:add(F.rd_rsvd, tvb(4, 1))
    st:add(F.rd_sqpn, tvb(5, 3))
    local ei = st:add(F.rd_epoch, tvb(8, 4))
    local pi = st:add(F.rd_psn, tvb(12, 4))
    if not d then
        ei:append_text(" (not valid: D = 0)")
        pi:append_text(" (not valid: D = 0)")
    end
    local ae = st:add(F.rd_ack_epoch, tvb(16, 4))
    if not (a or r) then ae:append_text(" (not valid: neither A nor R)") end
    if r then
        st:add(F.rd_floor, tvb(20, 4))
    else
        local ap = st:add(F.rd_ack_psn, tvb(20, 4))
        if not a then ap:append_text(" (not valid: A = 0)") end
    end
    st:add(F.rd_window, tvb(24, 2))
    st:add(F.rd_kind, kind):set_generated()

    -- Receive rules of §9.3 (after the CRC and octet 0).
    local ok = true
    if real_end < RD_SHIM_LEN then
        report(string.format("shorter than the %d-octet RD shim (Truncated)", RD_SHIM_LEN))
        ok = false
    elseif rsvd ~= 0 then
        report(string.format("reserved RD flag bits 0x%02x are set (Malformed)", rsvd))
        ok = false
    elseif a and r then
        report("RD flags A and R together (Malformed)")
        ok = false
    elseif n and not a then
        report("RD flag N without A (Malformed)")
        ok = false
    elseif syn and not d then
        report("RD flag S without D (Malformed)")
        ok = false
    elseif d and real_end == RD_SHIM_LEN then
        report("RD flag D but no DDP segment after the shim (Truncated)")
        ok = false
    elseif not d and real_end > RD_SHIM_LEN then
        report(string.format("%d octets after a control shim (D = 0) (Malformed)",
            real_end - RD_SHIM_LEN))
        ok = false
    end

    local info = { "RD" }
    if d then
        if syn then info[#info + 1] = "SYN" end
        info[#info + 1] = "PSN=" .. psn
    elseif not a then
        info[#info + 1] = kind
    end
    if a then
        info[#info + 1] = (n and "NAK=" or "ACK=") .. ack_psn
    elseif r then
        info[#info + 1] = string.format("Epoch=0x%08x Floor=0x%08x", ack_epoch, ack_psn)
    end
    if p then info[#info + 1] = "Poll" end
    info[#info + 1] = "Win=" .. window
    if n and a then
        st:add_proto_expert_info(E.rd_nak, string.format("RD NAK: PSN %d of epoch 0x%08x is missing",
            ack_psn, ack_epoch))
    end
    if r and not a then
        st:add_proto_expert_info(E.rd_reset, string.format(
            "RD reset: no session with epoch 0x%08x here (floor 0x%08x)", ack_epoch, ack_psn))
    end

    -- Retransmissions: the same data datagram position (flow, epoch, PSN)
    -- seen in an earlier frame.
    if d and crc_state == "good" then
        local key = string.format("%s:%d>%s:%d/%06x/%08x/%d", tostring(pinfo.src), pinfo.src_port,
            tostring(pinfo.dst), pinfo.dst_port, sqpn, epoch, psn)
        local first = rd_first_seen[key]
        if first == nil and not pinfo.visited then
            rd_first_seen[key] = pinfo.number
            first = pinfo.number
        end
        if first ~= nil and first ~= pinfo.number then
            st:add(F.rd_retransmission, true):set_generated()
            st:add(F.rd_first_frame, first):set_generated()
            st:add_proto_expert_info(E.rd_retransmission, string.format(
                "RD retransmission of PSN %d (epoch 0x%08x), first sent in frame %d", psn, epoch, first))
            info[#info + 1] = "[Retransmission]"
        else
            st:add(F.rd_retransmission, false):set_generated()
        end
    end
    return ok, d and ok, table.concat(info, " ")
end

-- -------------------------------------------------------------------------
-- The DDP segment
-- -------------------------------------------------------------------------

-- Adds the control octets and the buffer-model fields of a DDP header at
-- `off` to `t` using the field set `k` ("" or "term_ddp_"). Returns the
-- offset after the standard 14/18 octets. The caller checked the length.
local function add_standard_header(tvb, t, off, k, h)
    local ctl = t:add(F[k .. "ddp_ctrl"], tvb(off, 1))
    ctl:add(F[k .. "t"], tvb(off, 1))
    ctl:add(F[k .. "l"], tvb(off, 1))
    ctl:add(F[k .. "x"], tvb(off, 1))
    ctl:add(F[k .. "q"], tvb(off, 1))
    ctl:add(F[k .. "ddp_rsvd"], tvb(off, 1))
    ctl:add(F[k .. "dv"], tvb(off, 1))
    local rctl = t:add(F[k .. "rdmap_ctrl"], tvb(off + 1, 1))
    rctl:add(F[k .. "rv"], tvb(off + 1, 1))
    rctl:add(F[k .. "rdmap_rsvd"], tvb(off + 1, 1))
    rctl:add(F[k .. "opcode"], tvb(off + 1, 1))
    if h.t then
        t:add(F[k .. "stag"], tvb(off + 2, 4))
        t:add(F[k .. "to"], tvb(off + 6, 8))
        return off + 14
    end
    if h.opcode == 0x4 or h.opcode == 0x6 then
        t:add(F[k .. "inval_stag"], tvb(off + 2, 4))
    else
        t:add(F[k .. "rsvdulp"], tvb(off + 2, 4))
    end
    t:add(F[k .. "qn"], tvb(off + 6, 4))
    t:add(F[k .. "msn"], tvb(off + 10, 4))
    t:add(F[k .. "mo"], tvb(off + 14, 4))
    return off + 18
end

local function add_read_request(tvb, t, off, k)
    t:add(F[k .. "sink_stag"], tvb(off, 4))
    t:add(F[k .. "sink_to"], tvb(off + 4, 8))
    t:add(F[k .. "size"], tvb(off + 12, 4))
    t:add(F[k .. "src_stag"], tvb(off + 16, 4))
    t:add(F[k .. "src_to"], tvb(off + 20, 8))
end

-- The Terminate part at `off`, up to `seg_end`. Returns the offset after the
-- attachments, or nil (after reporting) if the segment ends inside them.
local function dissect_terminate(tvb, t, off, seg_end, report)
    if seg_end - off < 4 then
        report("Terminate control word is cut off (Truncated)")
        return nil
    end
    local word = tvb(off, 4):uint()
    local layer = rshift(word, 28)
    local etype = band(rshift(word, 24), 0x0F)
    local code = band(rshift(word, 16), 0xFF)
    local m = band(word, 0x8000) ~= 0
    local d = band(word, 0x4000) ~= 0
    local r = band(word, 0x2000) ~= 0
    local cause = term_description(layer, etype, code)
    local start = off
    local tt = t:add(F.term, tvb(off, seg_end - off))
    tt:set_text("Terminate: " .. cause)
    local ctl = tt:add(F.term_ctrl, tvb(off, 4))
    ctl:add(F.term_layer, tvb(off, 1))
    local et = ctl:add(F.term_etype, tvb(off, 1))
    local en = ETYPE_NAMES[layer] and ETYPE_NAMES[layer][etype]
    if en then et:append_text(" (" .. en .. ")") end
    local ci = ctl:add(F.term_code, tvb(off + 1, 1))
    local cn = TERM_CODES[layer] and TERM_CODES[layer][etype] and TERM_CODES[layer][etype][code]
    if cn then ci:append_text(" (" .. cn .. ")") end
    ctl:add(F.term_m, tvb(off + 2, 2))
    ctl:add(F.term_d, tvb(off + 2, 2))
    ctl:add(F.term_r, tvb(off + 2, 2))
    ctl:add(F.term_rsvd, tvb(off + 2, 2))
    tt:add(F.term_cause, cause):set_generated()
    off = off + 4
    if m or d then
        if seg_end - off < 2 then
            report("Terminate DDP segment length is cut off (Truncated)")
            return nil
        end
        local sl = tt:add(F.term_seg_len, tvb(off, 2))
        if not m then sl:append_text(" (not valid: M = 0)") end
        off = off + 2
    end
    if d then
        if seg_end - off < 1 then
            report("terminated DDP header is missing (Truncated)")
            return nil
        end
        local eh_c0 = tvb(off, 1):uint()
        local elen = band(eh_c0, 0x80) ~= 0 and 14 or 18
        if seg_end - off < elen then
            report(string.format(
                "terminated DDP header needs %d octets, %d left (Truncated)", elen, seg_end - off))
            return nil
        end
        local eh_c1 = tvb(off + 1, 1):uint()
        local eh = header_flags(eh_c0, eh_c1)
        local dt = tt:add(F.term_ddp, tvb(off, elen))
        dt:set_text(string.format("Terminated DDP header (%d octets): %s", elen,
            OPCODE_NAMES[eh.opcode]))
        add_standard_header(tvb, dt, off, "term_ddp_", eh)
        off = off + elen
    end
    if r then
        if seg_end - off >= 28 then
            local rt = tt:add(F.term_rdmap, tvb(off, 28))
            rt:set_text("Terminated RDMAP header (Read Request part)")
            add_read_request(tvb, rt, off, "term_rr_")
            off = off + 28
        else
            -- docs/datagram.md §4: taken as absent (siw sends such Terminates).
            tt:append_text(" [R is set but fewer than 28 octets follow: RDMAP header taken as absent]")
        end
    end
    tt:set_len(off - start)
    return off
end

-- Decodes one DDP segment from `off` (the DDP control octet) to `seg_end`
-- (where the CRC starts, or where the capture ends if the frame was captured
-- only in part; `real_end` is then where the CRC would start). `crc_state`
-- is "good", "bad" or "unverified"; header violations are errors only when
-- the CRC is good. Returns a short Info summary.
local function dissect_segment(tvb, pinfo, seg_tree, top_tree, off, seg_end, real_end, crc_state)
    local c0 = tvb(off, 1):uint()
    local c1 = tvb(off + 1, 1):uint()
    local h = header_flags(c0, c1)
    local start = off
    local notes = {}

    local function report(text)
        if crc_state ~= "good" then
            seg_tree:add_proto_expert_info(E.violation_unchecked, text)
        else
            seg_tree:add_proto_expert_info(E.violation, text)
        end
        notes[#notes + 1] = text
    end
    local function warn(text)
        seg_tree:add_proto_expert_info(E.protocol, text)
    end

    local name = OPCODE_SHORT[h.opcode] or string.format("Opcode 0x%x", h.opcode)

    -- Order of docs/datagram.md §4 (after the CRC): versions, reserved bits,
    -- T against the opcode, X on Read Response / Write-Record, lengths.
    if h.dv ~= 1 then
        report(string.format("DV = %d, not 1 (BadVersion)", h.dv))
    end
    if h.rv ~= 1 then
        report(string.format("RV = %d, not 1 (BadVersion)", h.rv))
    end
    if h.rsvd ~= 0 then
        report(string.format("reserved DDP control bits 0x%02x are set (Malformed)", h.rsvd))
    end
    if h.x and not h.t then
        report("X is set on an untagged segment (Malformed)")
    end
    if h.opcode <= 0xC then
        if (TAGGED_OP[h.opcode] or false) ~= h.t then
            report(string.format("%s with T = %d: wrong buffer model (Malformed)",
                OPCODE_NAMES[h.opcode], h.t and 1 or 0))
        end
        if (h.opcode == 0x2 or h.opcode == 0xC) and h.t and not h.x then
            report(OPCODE_NAMES[h.opcode] .. " without X (Malformed)")
        end
    end
    if h.rdmap_rsvd ~= 0 then
        warn(string.format("reserved RDMAP control bits 0x%02x are set (ignored on receive)", h.rdmap_rsvd))
    end
    if h.opcode > 0xC then
        warn(string.format("opcode 0x%x is not defined in datagram mode (answered by a Terminate)", h.opcode))
    end

    local hlen = ddp_header_len(h)
    local available = seg_end - off
    if available < hlen then
        report(string.format("segment ends inside the %d-octet DDP header (%d octets) (Truncated)",
            hlen, available))
        if available > 0 then seg_tree:add(F.undecoded, tvb(off, available)) end
        return name .. " [truncated]"
    end

    local info = { name }
    off = add_standard_header(tvb, seg_tree, off, "", h)
    if h.t then
        info[#info + 1] = "STag=" .. hex8(tvb(start + 2, 4):uint())
        info[#info + 1] = "TO=0x" .. tvb(start + 6, 8):uint64():tohex()
        if h.x then
            seg_tree:add(F.tmsn, tvb(off, 4))
            seg_tree:add(F.tmo, tvb(off + 4, 4))
            local base_to = tvb(start + 6, 8):uint64() - tvb(off + 4, 4):uint()
            seg_tree:add(F.base_to, base_to):set_generated()
            info[#info + 1] = "T-MSN=" .. tvb(off, 4):uint()
            info[#info + 1] = "T-MO=" .. tvb(off + 4, 4):uint()
            off = off + 8
        end
    else
        local qn = tvb(start + 6, 4):uint()
        if h.opcode == 0x4 or h.opcode == 0x6 then
            info[#info + 1] = "InvSTag=" .. hex8(tvb(start + 2, 4):uint())
        end
        info[#info + 1] = "QN=" .. qn
        info[#info + 1] = "MSN=" .. tvb(start + 10, 4):uint()
        info[#info + 1] = "MO=" .. tvb(start + 14, 4):uint()
        local want = QUEUE_OF[h.opcode]
        if want ~= nil and want ~= qn and not h.t then
            warn(string.format("%s on queue %d (expected QN %d)", OPCODE_NAMES[h.opcode], qn, want))
        end
    end
    if h.q then
        seg_tree:add(F.dqpn, tvb(off, 4))
        info[#info + 1] = "DQPN=" .. string.format("0x%x", tvb(off, 4):uint())
        off = off + 4
    end

    -- The opcode-specific part (untagged segments only).
    if not h.t then
        local need = EXACT_PART[h.opcode]
        if need then
            if seg_end - off < need then
                report(string.format("%s part needs %d octets, %d left (Truncated)",
                    OPCODE_NAMES[h.opcode], need, seg_end - off))
                if seg_end > off then seg_tree:add(F.undecoded, tvb(off, seg_end - off)) end
                return table.concat(info, " ") .. " [truncated]"
            end
            if h.opcode == 0x1 then
                local rt = seg_tree:add(F.rr, tvb(off, 28))
                rt:set_text("RDMA Read Request: sink " .. hex8(tvb(off, 4):uint())
                    .. ", " .. tvb(off + 12, 4):uint() .. " octets from " .. hex8(tvb(off + 16, 4):uint()))
                add_read_request(tvb, rt, off, "rr_")
                info[#info + 1] = "Size=" .. tvb(off + 12, 4):uint()
            elseif h.opcode == 0xA then
                local at = seg_tree:add(F.atomic, tvb(off, 52))
                at:set_text("Atomic Request")
                at:add(F.atomic_opword, tvb(off, 4))
                at:add(F.atomic_rsvd, tvb(off, 4))
                at:add(F.atomic_req_id, tvb(off + 4, 4))
                at:add(F.atomic_stag, tvb(off + 8, 4))
                at:add(F.atomic_to, tvb(off + 12, 8))
                at:add(F.atomic_add_swap, tvb(off + 20, 8))
                at:add(F.atomic_add_swap_mask, tvb(off + 28, 8))
                at:add(F.atomic_compare, tvb(off + 36, 8))
                at:add(F.atomic_compare_mask, tvb(off + 44, 8))
                local op = tvb(off, 4):uint()
                info[#info + 1] = (ATOMIC_OP_NAMES[op] or string.format("op 0x%x", op))
                    .. " ReqID=" .. tvb(off + 4, 4):uint()
            elseif h.opcode == 0xB then
                local at = seg_tree:add(F.atomic_resp, tvb(off, 12))
                at:set_text("Atomic Response")
                at:add(F.atomic_orig_req_id, tvb(off, 4))
                at:add(F.atomic_orig_value, tvb(off + 4, 8))
                info[#info + 1] = "ReqID=" .. tvb(off, 4):uint()
            else
                seg_tree:add(F.immediate, tvb(off, 8))
                info[#info + 1] = "Imm=0x" .. tvb(off, 8):uint64():tohex()
            end
            off = off + need
            if off < real_end then
                report(string.format("%d octets follow the %s part (Malformed)",
                    real_end - off, OPCODE_NAMES[h.opcode]))
            end
        elseif h.opcode == 0x7 then
            local after = dissect_terminate(tvb, seg_tree, off, seg_end, report)
            if after == nil then
                return table.concat(info, " ") .. " [truncated]"
            end
            local w = tvb(off, 4):uint()
            info[#info + 1] = term_description(rshift(w, 28), band(rshift(w, 24), 0x0F),
                band(rshift(w, 16), 0xFF))
            off = after
        end
    end

    seg_tree:add(F.hdr_len, off - start):set_generated()
    local plen = real_end - off
    seg_tree:add(F.payload_len, plen):set_generated()
    if seg_end > off then
        seg_tree:add(F.payload, tvb(off, seg_end - off))
    end
    info[#info + 1] = "Len=" .. plen
    if h.l then info[#info + 1] = "[L]" end
    if #notes > 0 then info[#info + 1] = "[" .. notes[1] .. "]" end

    -- Segments with no extension bits and a standard opcode are standard
    -- ULPDUs: Wireshark's own DDP/RDMAP dissector can show them as well
    -- (docs/datagram.md §5).
    if srdma.prefs.builtin and ddp_rdmap ~= nil and not h.x and not h.q and h.rsvd == 0
        and h.dv == 1 and h.rv == 1 and h.opcode <= 0xB and crc_state == "good" then
        pcall(function()
            ddp_rdmap:call(tvb(start, seg_end - start):tvb(), pinfo, top_tree)
        end)
    end
    return table.concat(info, " ")
end

-- -------------------------------------------------------------------------
-- Classification and the datagram
-- -------------------------------------------------------------------------

-- Decides whether a UDP payload is ours, without touching the tree.
-- `how` is "port" (configured port or followed flow) or "heur".
-- Returns nil (not ours) or a table { crc, wire, verified, shim }.
local function classify(tvb, how)
    local len = tvb:len()
    if len < 6 then return nil end
    local complete = tvb:reported_len() == len
    local c0 = tvb(0, 1):uint()
    local c1 = tvb(1, 1):uint()
    local h = header_flags(c0, c1)
    local looks_ddp = h.dv == 1 and h.rv == 1
    -- An RD shim of the version we know, long enough for the shim and the
    -- CRC (docs/datagram.md §9.1).
    local looks_rd = c0 == RD_MAGIC and tvb:reported_len() >= RD_SHIM_LEN + 4
    if how == "heur" then
        local ud = looks_ddp and h.rsvd == 0 and (h.t or not h.x)
        local rd = looks_rd and band(tvb(4, 1):uint(), 0x03) == 0
        if not ((ud or rd) and complete) then
            return nil
        end
    elseif not looks_ddp and not looks_rd and not complete then
        return nil
    end
    -- Octet 0 with low bits 0b10 starts a shim (RD, or another version).
    local shim = band(c0, 0x03) == 0x02
    if not complete then
        return { verified = false, shim = shim }
    end
    local crc = crc32c_tvb(tvb, 0, len - 4)
    local wire = tvb(len - 4, 4):le_uint()
    local good = crc == wire
    if how == "heur" and not good then return nil end
    if not good and not looks_ddp and not looks_rd then
        -- Neither a DDP control octet nor our shim, and a wrong CRC:
        -- foreign traffic.
        return nil
    end
    return { crc = crc, wire = wire, good = good, verified = true, shim = shim }
end

local function dissect_datagram(tvb, pinfo, tree, how)
    local c = classify(tvb, how)
    if c == nil then return 0 end

    local len = tvb:len()
    local real_end = tvb:reported_len() - 4
    -- Decode only what was captured; the CRC is at real_end.
    local seg_end = math.min(len, real_end)
    pinfo.cols.protocol = "SRDMA"
    local root = tree:add(srdma, tvb())
    local crc_state = (not c.verified and "unverified") or (c.good and "good") or "bad"

    local info
    if c.shim then
        -- Octet 0 is not a DDP control octet (its low bits are 0b10): the
        -- RD shim leads, and a DDP segment follows it when D is set.
        root:append_text(", RD")
        local ok, has_segment, shim_info = dissect_rd_shim(tvb, pinfo, root, seg_end,
            real_end, crc_state)
        info = shim_info
        if has_segment and seg_end >= RD_SHIM_LEN + 2 then
            info = info .. " | " .. dissect_segment(tvb, pinfo, root, tree, RD_SHIM_LEN,
                seg_end, real_end, crc_state)
            -- §9.3 rule 7: a Q word must name the shim's DQPN.
            local h = header_flags(tvb(RD_SHIM_LEN, 1):uint(), tvb(RD_SHIM_LEN + 1, 1):uint())
            local qat = RD_SHIM_LEN + ddp_header_len(h) - 4
            if h.q and qat + 4 <= seg_end then
                local q = band(tvb(qat, 4):uint(), 0x00FFFFFF)
                local dq = tvb(1, 3):uint()
                if q ~= dq then
                    local text = string.format(
                        "DDP DQPN 0x%06x differs from the RD shim's DQPN 0x%06x (Malformed)", q, dq)
                    if crc_state ~= "good" then
                        root:add_proto_expert_info(E.violation_unchecked, text)
                    else
                        root:add_proto_expert_info(E.violation, text)
                    end
                end
            end
        elseif has_segment then
            root:add(F.undecoded, tvb(RD_SHIM_LEN, seg_end - RD_SHIM_LEN))
            local text = "the DDP segment after the RD shim is shorter than 2 octets (Truncated)"
            if crc_state ~= "good" then
                root:add_proto_expert_info(E.violation_unchecked, text)
            else
                root:add_proto_expert_info(E.violation, text)
            end
        end
        if not ok and seg_end > RD_SHIM_LEN and tvb(0, 1):uint() == RD_MAGIC then
            root:add(F.undecoded, tvb(RD_SHIM_LEN, seg_end - RD_SHIM_LEN))
        end
    else
        info = dissect_segment(tvb, pinfo, root, tree, 0, seg_end, real_end, crc_state)
    end

    -- The CRC trailer: wire octets c0..c3, value = c0 | c1<<8 | c2<<16 | c3<<24.
    if not c.verified then
        root:add(F.crc_status, 2):set_generated()
        root:add_proto_expert_info(E.crc_unverified)
        info = info .. " [CRC not captured]"
    else
        local wire_hex = string.format("%02x %02x %02x %02x", tvb(seg_end, 1):uint(),
            tvb(seg_end + 1, 1):uint(), tvb(seg_end + 2, 1):uint(), tvb(seg_end + 3, 1):uint())
        local crc_item = root:add_le(F.crc, tvb(seg_end, 4))
        crc_item:append_text(" (wire octets " .. wire_hex .. ", least significant first)")
        if c.good then
            crc_item:append_text(" [correct]")
            root:add(F.crc_status, 1):set_generated()
        else
            crc_item:append_text(string.format(" [incorrect, should be 0x%08x]", c.crc))
            root:add(F.crc_computed, c.crc):set_generated()
            root:add(F.crc_status, 0):set_generated()
            crc_item:add_proto_expert_info(E.crc_bad, string.format(
                "Bad CRC32C: 0x%08x, should be 0x%08x", c.wire, c.crc))
            info = info .. " [BAD CRC]"
        end
    end

    pinfo.cols.info:set(info)
    -- The built-in dissector may have changed the columns; ours win.
    pinfo.cols.protocol = "SRDMA"
    return len
end

function srdma.dissector(tvb, pinfo, tree)
    return dissect_datagram(tvb, pinfo, tree, "port")
end

local function heuristic(tvb, pinfo, tree)
    local n = dissect_datagram(tvb, pinfo, tree, "heur")
    if n == 0 then return false end
    if srdma.prefs.follow then
        pinfo.conversation = srdma
    end
    return true
end
srdma:register_heuristic("udp", heuristic)

-- -------------------------------------------------------------------------
-- Port registration; re-done when the preference changes.
-- -------------------------------------------------------------------------

local udp_port = DissectorTable.get("udp.port")
local registered = ""

local function register_ports()
    local want = srdma.prefs.ports or ""
    if want == registered then return end
    if registered ~= "" then udp_port:remove(registered, srdma) end
    if want ~= "" then udp_port:add(want, srdma) end
    registered = want
end

function srdma.prefs_changed()
    register_ports()
end

register_ports()
udp_port:add_for_decode_as(srdma)
