//! The event trace: what is recorded, and that the Chrome trace-event JSON parses and has
//! the shape Perfetto and `chrome://tracing` expect.

mod common;

use common::*;
use zverbs_sim::*;

/// A parsed JSON value (just enough JSON to check the writer's output).
#[derive(Debug, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Obj(kv) => kv.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
}

/// A strict recursive-descent parser; `Err` names the byte offset of the first problem.
struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn parse(text: &str) -> Result<Json, usize> {
        let mut p = Parser {
            s: text.as_bytes(),
            i: 0,
        };
        let v = p.value()?;
        p.ws();
        if p.i == p.s.len() {
            Ok(v)
        } else {
            Err(p.i)
        }
    }

    fn ws(&mut self) {
        while self.s.get(self.i).is_some_and(|c| c.is_ascii_whitespace()) {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> Result<(), usize> {
        self.ws();
        (self.s.get(self.i) == Some(&c))
            .then(|| self.i += 1)
            .ok_or(self.i)
    }

    fn value(&mut self) -> Result<Json, usize> {
        self.ws();
        match self.s.get(self.i).copied().ok_or(self.i)? {
            b'{' => {
                self.i += 1;
                let mut kv = Vec::new();
                if self.eat(b'}').is_ok() {
                    return Ok(Json::Obj(kv));
                }
                loop {
                    self.ws();
                    let Json::Str(k) = self.value()? else {
                        return Err(self.i);
                    };
                    self.eat(b':')?;
                    kv.push((k, self.value()?));
                    if self.eat(b',').is_err() {
                        self.eat(b'}')?;
                        return Ok(Json::Obj(kv));
                    }
                }
            }
            b'[' => {
                self.i += 1;
                let mut items = Vec::new();
                if self.eat(b']').is_ok() {
                    return Ok(Json::Arr(items));
                }
                loop {
                    items.push(self.value()?);
                    if self.eat(b',').is_err() {
                        self.eat(b']')?;
                        return Ok(Json::Arr(items));
                    }
                }
            }
            b'"' => {
                self.i += 1;
                let mut out = String::new();
                loop {
                    match *self.s.get(self.i).ok_or(self.i)? {
                        b'"' => break,
                        b'\\' => {
                            self.i += 1;
                            match *self.s.get(self.i).ok_or(self.i)? {
                                b'"' => out.push('"'),
                                b'\\' => out.push('\\'),
                                b'u' => {
                                    let hex = self.s.get(self.i + 1..self.i + 5).ok_or(self.i)?;
                                    let hex = std::str::from_utf8(hex).map_err(|_| self.i)?;
                                    let c = u32::from_str_radix(hex, 16).map_err(|_| self.i)?;
                                    out.push(char::from_u32(c).ok_or(self.i)?);
                                    self.i += 4;
                                }
                                _ => return Err(self.i),
                            }
                        }
                        c if c < 0x20 => return Err(self.i),
                        _ => {
                            let len = utf8_len(self.s[self.i]);
                            let ch = self.s.get(self.i..self.i + len).ok_or(self.i)?;
                            out.push_str(std::str::from_utf8(ch).map_err(|_| self.i)?);
                            self.i += len - 1;
                        }
                    }
                    self.i += 1;
                }
                self.i += 1;
                Ok(Json::Str(out))
            }
            b't' | b'f' | b'n' => {
                for (word, v) in [("true", Json::Bool(true)), ("false", Json::Bool(false))] {
                    if self.s[self.i..].starts_with(word.as_bytes()) {
                        self.i += word.len();
                        return Ok(v);
                    }
                }
                if self.s[self.i..].starts_with(b"null") {
                    self.i += 4;
                    return Ok(Json::Null);
                }
                Err(self.i)
            }
            _ => {
                let start = self.i;
                let num = |c: &u8| c.is_ascii_digit() || b"-+.eE".contains(c);
                while self.s.get(self.i).is_some_and(num) {
                    self.i += 1;
                }
                let text = std::str::from_utf8(&self.s[start..self.i]).map_err(|_| start)?;
                text.parse().map(Json::Num).map_err(|_| start)
            }
        }
    }
}

fn utf8_len(first: u8) -> usize {
    match first {
        0xf0.. => 4,
        0xe0.. => 3,
        0xc0.. => 2,
        _ => 1,
    }
}

/// A faulty stepped run with every kind of event: drops, duplicates, delays, an RNR wait,
/// retransmissions, an error and its flush.
fn eventful(seed: u64) -> Fabric {
    let faults = Faults {
        drop: 0.2,
        duplicate: 0.2,
        delay: 0.2,
        max_extra_delay_ns: 3_000,
    };
    let p = pair_in(stepped(seed, faults, 2), Cfg::default(), rts_attr());
    let (a_buf, b_buf) = (Buf::new(64, 1), Buf::new(64, 0));
    let ma = a_buf.reg(&p.a.pd, all_access());
    let mb = b_buf.reg(&p.b.pd, all_access());
    let write = |id, rkey| {
        let op = SendOp::Write {
            remote_addr: mb.addr(),
            rkey,
        };
        sig(id, op, &[sge(&ma, 0, 8)])
    };
    p.a.qp
        .post_send(&[sig(1, SendOp::Send, &[sge(&ma, 0, 8)]), write(2, mb.rkey())])
        .unwrap();
    p.fabric.run_until_idle_max(50);
    p.b.qp.post_recv(&[rwr(3, &[sge(&mb, 8, 8)])]).unwrap();
    p.fabric.run_until_idle();
    p.a.qp.post_send(&[write(4, mb.rkey() ^ 1)]).unwrap();
    p.fabric.run_until_idle();
    let f = p.fabric.clone();
    drop(p); // destroying the objects leaves the trace alone
    f
}

#[test]
fn chrome_trace_parses_and_has_the_expected_shape() {
    let f = eventful(3);
    let text = trace_json(&f);
    let json = Parser::parse(&text).unwrap_or_else(|at| panic!("bad JSON at {at}: {text}"));
    let Some(Json::Arr(events)) = json.get("traceEvents") else {
        panic!("no traceEvents array");
    };
    let (mut meta, mut last_ts) = (0, 0.0);
    for e in events {
        let str_of = |k| match e.get(k) {
            Some(Json::Str(s)) => s.as_str(),
            other => panic!("{k} of {e:?} is {other:?}"),
        };
        let num_of = |k| match e.get(k) {
            Some(Json::Num(n)) => *n,
            other => panic!("{k} of {e:?} is {other:?}"),
        };
        let (name, ph, pid, tid) = (str_of("name"), str_of("ph"), num_of("pid"), num_of("tid"));
        assert!(pid == 0.0 || pid == 1.0, "pid is a device index");
        match ph {
            "M" => {
                meta += 1;
                let Some(Json::Str(label)) = e.get("args").and_then(|a| a.get("name")) else {
                    panic!("metadata without a name: {e:?}");
                };
                match name {
                    "process_name" => assert_eq!(label, &format!("sim{pid}")),
                    "thread_name" => assert_eq!(label, &format!("QP {:#x}", tid as u32)),
                    _ => panic!("unexpected metadata {name}"),
                }
            }
            "i" => {
                let ts = num_of("ts");
                assert!(ts >= last_ts, "events in time order");
                last_ts = ts;
                assert!(tid >= 17.0, "tid is a QPN");
                assert!(matches!(e.get("args"), Some(Json::Obj(_))));
            }
            _ => panic!("unexpected phase {ph}"),
        }
    }
    assert_eq!(meta, 2 + 2, "two processes, two threads");
    assert_eq!(events.len() - meta, f.trace_len());
    for name in [
        "post_send",
        "post_recv",
        "packet_send",
        "retransmit",
        "drop",
        "duplicate",
        "delay",
        "deliver",
        "execute",
        "rnr_nak",
        "rnr_wait",
        "timeout",
        "completion",
        "qp_state",
    ] {
        assert!(count(&text, name) > 0, "no {name} event");
    }
}

#[test]
fn trace_events_match_the_json_and_clear() {
    let f = eventful(4);
    let events = f.trace_events();
    assert_eq!(events.len(), f.trace_len());
    assert!(events.windows(2).all(|w| w[0].time_ns <= w[1].time_ns));
    let done = events
        .iter()
        .filter(|e| matches!(e.kind, TraceKind::Complete(..)))
        .count();
    assert_eq!(done, count(&trace_json(&f), "completion"));
    // The bad rkey: a NAK, both sides to ERR.
    let nak = PacketKind::Nak(WcStatus::RemAccessErr);
    assert!(events.iter().any(|e| e.kind == TraceKind::Send(nak)));
    let to_err = |e: &&TraceEvent| matches!(e.kind, TraceKind::State(_, QpState::Error));
    assert_eq!(events.iter().filter(to_err).count(), 2);
    f.clear_trace();
    assert_eq!((f.trace_len(), f.trace_events().len()), (0, 0));
    assert!(
        Parser::parse(&trace_json(&f)).is_ok(),
        "an empty trace is valid too"
    );
}

#[test]
fn untraced_fabric_records_nothing() {
    let p = pair_in(
        Fabric::with_config(FabricConfig::stepped(1), 2),
        Cfg::default(),
        rts_attr(),
    );
    p.a.qp.post_send(&[sig(1, SendOp::Send, &[])]).unwrap();
    p.b.qp.post_recv(&[rwr(2, &[])]).unwrap();
    assert_eq!(ids(&drain(&p.a.cq)), [(1, WcStatus::Success)]);
    assert_eq!(p.fabric.trace_len(), 0);
}

#[test]
fn the_parser_rejects_broken_json() {
    for bad in ["{", "{\"a\":}", "[1,]", "{\"a\" 1}", "\"\u{1}\"", "[] x"] {
        assert!(Parser::parse(bad).is_err(), "{bad}");
    }
    let ok = Parser::parse("{\"a\":[1,-2.5e3,true,null,\"\\u00e9\\\"\"]}").unwrap();
    assert_eq!(
        ok.get("a"),
        Some(&Json::Arr(vec![
            Json::Num(1.0),
            Json::Num(-2500.0),
            Json::Bool(true),
            Json::Null,
            Json::Str("é\"".into())
        ]))
    );
}
