//! What a ported C verbs program relies on, on every backend: a receive
//! posted in INIT, before the endpoint exchange, catches the peer's first message; a scoped
//! receive reports its completion (byte count, immediate data) after "post a receive, then
//! send"; a prebuilt chain (perftest's loop) is posted again and again as it was built.

use std::thread;

use zverbs::Op;

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

/// A builds a batch of two writes and posts it; adds a read, moves the batch, and posts it
/// twice in a second scope, behind a staged write (its ring of 4 makes room in between).
pub fn prepared_batch<E: Env>(env: &E) -> Run<Outcome> {
    let ends = prepare_pair(env, env.timeout())?;
    let (a, b) = (ends.a, ends.b);
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let mut a = a.connect(&eb).map_err(err("connect a"))?;
    let _b = b.connect(&ea).map_err(err("connect b"))?;
    let mut src = region(&ends.pa, 12, AccessFlags::LOCAL_WRITE, 0)?;
    src.as_mut_slice().copy_from_slice(b"abcdefghijkl");
    let mut back = region(&ends.pa, 4, AccessFlags::LOCAL_WRITE, 0)?;
    let target = region(&ends.pb, 16, AccessFlags::all(), b'r')?;
    let remote = target.remote();
    let (first_half, second_half) = (src.slice(..4), src.slice(4..8));
    let (first_half, second_half) = (
        first_half.map_err(err("slice"))?,
        second_half.map_err(err("slice"))?,
    );
    let into = back.slice_mut(..).map_err(err("slice"))?;
    let (to4, to12) = (
        remote.slice(4..).map_err(err("remote"))?,
        remote.slice(12..).map_err(err("remote"))?,
    );
    let mut batch = a.batch::<3>();
    batch
        .push(Op::write([first_half], &remote))
        .map_err(err("push"))?;
    batch
        .push(Op::write([second_half], &to4))
        .map_err(err("push"))?;
    let first = a
        .scope(|s| s.post_batch(&mut batch))
        .map_err(err("first scope"))?;
    // Grown after a post, and moved: the next post links the entries again where they lie.
    batch.push(Op::read([into], &to12)).map_err(err("push"))?;
    let mut batch = Box::new(batch);
    let (staged, second, third) = a
        .scope(|s| {
            let staged = s.post_write([src.slice(8..)?], &remote.slice(8..)?)?;
            let second = s.post_batch(&mut *batch)?;
            let third = s.post_batch(&mut *batch)?;
            s.wait_send(third.end - 1)?;
            Ok((staged, second, third))
        })
        .map_err(err("second scope"))?;
    let in_flight = a.in_flight();
    // The blocking level, twice: posted where the last post left it, then linked as it lies.
    for _ in 0..2 {
        a.execute_batch(&mut *batch).map_err(err("execute"))?;
    }
    let executed = a.in_flight();
    let mut o = Outcome::default();
    o.item("first", format_args!("{first:?}"))
        .item("staged", staged)
        .item("second", format_args!("{second:?}"))
        .item("third", format_args!("{third:?}"))
        .item("in_flight", format_args!("{in_flight:?}"))
        .item("executed", format_args!("{executed:?}"))
        .check("written", &target.as_slice()[..12] == b"abcdefghijkl")
        .check("read", back.as_slice() == b"rrrr");
    Ok(o)
}

#[allow(non_upper_case_globals)]
pub mod expected {
    pub const recv_posted_in_init: &str = "send=ok; received=5; bytes=ok";
    pub const scoped_receive_completion: &str =
        "byte_len=4; imm=Some(7); in_flight=(0, 0); bytes=ok";
    pub const prepared_batch: &str =
        "first=0..2; staged=2; second=3..6; third=6..9; in_flight=(0, 0); executed=(0, 0); written=ok; read=ok";
}
