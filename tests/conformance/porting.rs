//! What a ported C verbs program relies on, on every backend: a receive
//! posted in INIT, before the endpoint exchange, catches the peer's first message; a scoped
//! receive reports its completion (byte count, immediate data) after "post a receive, then
//! send".

use std::thread;

use super::liveness::prepare_pair;
use super::*;

/// B posts a receive while its queue pair is in INIT, before either side connected. A
/// connects and sends at once (its send waits for B's RTR, within its retries); B connects
/// 50 ms later and redeems the early receive.
pub fn recv_posted_in_init<E: Env>(env: &E) -> Run<Outcome> {
    let mut ends = prepare_pair(env, env.timeout())?;
    let mut inbox = region(&ends.pb, 8, AccessFlags::LOCAL_WRITE, 0)?;
    let inbox_sge = inbox.slice_mut(..).map_err(err("slice"))?.sge();
    // SAFETY: the leaked region is read only after the receive is redeemed below.
    let early = unsafe { ends.b.post_receive_unpolled(&[inbox_sge]) }.map_err(err("post"))?;
    let (a, b) = (ends.a, ends.b);
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let mut a = a.connect(&eb).map_err(err("connect a"))?;
    let outbox = region(&ends.pa, 5, AccessFlags::LOCAL_WRITE, b'i')?;
    let (sent, got) = thread::scope(|t| {
        let sender = t.spawn(|| {
            let slice = outbox.slice(..).map_err(err("slice"))?;
            a.send([slice]).map_err(err("send"))
        });
        thread::sleep(Duration::from_millis(50));
        let got = b
            .connect(&ea)
            .map_err(err("connect b"))
            .and_then(|mut b| b.wait(early).map_err(err("wait")));
        let sent = sender
            .join()
            .unwrap_or_else(|_| Err("sender panicked".into()));
        (sent, got)
    });
    let mut o = Outcome::default();
    o.item("send", sent.map(|()| "ok").unwrap_or("failed"));
    o.item("received", got.map(|c| c.byte_len)?);
    o.check("bytes", &inbox.as_slice()[..5] == b"iiiii");
    Ok(o)
}

/// A scope posts a receive, then a send, and reads the receive's completion while the
/// scope still holds its buffer; B echoes what it got with immediate data 7.
pub fn scoped_receive_completion<E: Env>(env: &E) -> Run<Outcome> {
    let ends = prepare_pair(env, env.timeout())?;
    let (a, b) = (ends.a, ends.b);
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let mut a = a.connect(&eb).map_err(err("connect a"))?;
    let mut b = b.connect(&ea).map_err(err("connect b"))?;
    let ask = region(&ends.pa, 4, AccessFlags::LOCAL_WRITE, b'q')?;
    let mut answer = region(&ends.pa, 16, AccessFlags::LOCAL_WRITE, 0)?;
    let mut echo = region(&ends.pb, 16, AccessFlags::LOCAL_WRITE, 0)?;
    let (echoed, got) = thread::scope(|t| {
        let echoer = t.spawn(|| -> Run<()> {
            let c = b
                .receive([echo.slice_mut(..).map_err(err("slice"))?])
                .map_err(err("receive"))?;
            let n = c.byte_len as usize;
            let slice = echo.slice(..n).map_err(err("slice"))?;
            b.send_with_imm([slice], 7).map_err(err("echo"))
        });
        let got = a
            .scope(|s| {
                let reply = s.post_receive([answer.slice_mut(..)?])?;
                s.post_send([ask.slice(..)?])?;
                s.wait_receive(reply)
            })
            .map_err(err("scope"));
        let echoed = echoer
            .join()
            .unwrap_or_else(|_| Err("echoer panicked".into()));
        (echoed, got)
    });
    echoed?;
    let got = got?;
    let mut o = Outcome::default();
    o.item("byte_len", got.byte_len)
        .item("imm", format_args!("{:?}", got.imm))
        .item("in_flight", format_args!("{:?}", a.in_flight()))
        .check("bytes", &answer.as_slice()[..4] == b"qqqq");
    Ok(o)
}

#[allow(non_upper_case_globals)]
pub mod expected {
    pub const recv_posted_in_init: &str = "send=ok; received=5; bytes=ok";
    pub const scoped_receive_completion: &str =
        "byte_len=4; imm=Some(7); in_flight=(0, 0); bytes=ok";
}
