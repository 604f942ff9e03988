//! What a C verbs program does, ported: receives posted in INIT before
//! the endpoint exchange (unpolled, and safely in a connect scope), and a scoped receive whose completion (byte count, immediate
//! data) is read safely after "post a receive, then send".
#![cfg(feature = "sim")]

mod common;

use std::time::Duration;

use zverbs::provider::sim::Sim;
use zverbs::{Channel, ChannelConfig, Context, Error, PreparedChannel, ProtectionDomain};

/// One side of [`prepared`]: a channel prepared on its device, not connected.
struct Side<const DEPTH: usize> {
    ch: PreparedChannel<Sim, DEPTH, 1>,
    pd: ProtectionDomain<Sim>,
    _ctx: Context<Sim>,
}

/// Two channels prepared on `sim0` and `sim1` of one fabric, with the default settings.
fn prepared<const DEPTH: usize>() -> (Side<DEPTH>, Side<DEPTH>) {
    let sim = Sim::with_devices(2);
    let side = |name| {
        let ctx = Context::open(&sim, name).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let ch = Channel::prepare(&ctx, &pd, &ChannelConfig::default()).unwrap();
        Side { ch, pd, _ctx: ctx }
    };
    (side("sim0"), side("sim1"))
}

#[test]
fn a_receive_posted_before_connect_catches_the_first_message() {
    let (a, b) = prepared::<8>();
    let (pa, pb) = (&a.pd, &b.pd);
    let (a, mut b) = (a.ch, b.ch);
    let mut inbox = [[0u8; 16]; 3];
    let mut regions: Vec<_> = inbox.iter_mut().map(|b| pb.register(b).unwrap()).collect();
    // Three receives in INIT, before either side knows the other's endpoint.
    let early: Vec<_> = regions
        .iter_mut()
        // SAFETY: the regions are read only after the receives are redeemed.
        .map(|r| unsafe { b.post_receive_unpolled(&[r.slice_mut(..).unwrap().sge()]) }.unwrap())
        .collect();
    let (ea, eb) = (a.endpoint(), b.endpoint());
    // b connects first, then a sends at once: the messages find b's receives.
    let mut b = b.connect(&ea).unwrap();
    let mut a = a.connect(&eb).unwrap();
    let mut msg = *b"first message";
    let msg = pa.register(&mut msg).unwrap();
    for n in [5, 13, 1] {
        a.send([msg.slice(..n).unwrap()]).unwrap();
    }
    let lens: Vec<_> = early
        .into_iter()
        .map(|p| b.wait(p).unwrap().byte_len)
        .collect();
    assert_eq!(lens, [5, 13, 1]);
    drop(regions);
    assert_eq!(&inbox[1][..13], b"first message");
}

/// The same, safely: the receives posted in INIT belong to a scope on the connected
/// channel, which returns only once they completed.
#[test]
fn receives_posted_before_connect_in_a_connect_scope_need_no_unsafe() {
    let (a, b) = prepared::<8>();
    let (pa, pb) = (&a.pd, &b.pd);
    let (a, b) = (a.ch, b.ch);
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let mut a = a.connect(&eb).unwrap();
    let mut msg = *b"first message";
    let msg = pa.register(&mut msg).unwrap();
    let mut inbox = [[0u8; 16]; 3];
    let mut regions = inbox.each_mut().map(|b| pb.register(b).unwrap());
    let early = regions.each_mut().map(|r| r.slice_mut(..).unwrap());
    let (mut b, lens) = b
        .connect_scope(&ea, early, |s, handles| {
            for n in [5, 13, 1] {
                a.send([msg.slice(..n)?])?;
            }
            let mut lens = [0; 3];
            for (len, h) in lens.iter_mut().zip(handles) {
                *len = s.wait_receive(h)?.byte_len;
            }
            Ok(lens)
        })
        .unwrap();
    assert_eq!(lens, [5, 13, 1]);
    assert_eq!(b.in_flight(), (0, 0));
    // The channel goes on as any connected one.
    let mut more = [0u8; 4];
    let mut more = pb.register(&mut more).unwrap();
    std::thread::scope(|t| {
        t.spawn(|| a.send([msg.slice(..4).unwrap()]).unwrap());
        assert_eq!(
            b.receive([more.slice_mut(..).unwrap()]).unwrap().byte_len,
            4
        );
    });
    drop(regions);
    assert_eq!(&inbox[1][..13], b"first message");
}

/// More early receives than the channel's ring holds: refused before connecting, with the
/// error the post gave.
#[test]
fn a_connect_scope_refuses_more_early_receives_than_the_ring_holds() {
    let (a, b) = prepared::<2>();
    let (pb, a, b) = (&b.pd, a.ch, b.ch);
    let mut inbox = [0u8; 24];
    let mut inbox = pb.register(&mut inbox).unwrap();
    let (x, rest) = inbox.slice_mut(..).unwrap().split_at(8).unwrap();
    let (y, z) = rest.split_at(8).unwrap();
    let r = b.connect_scope(&a.endpoint(), [x, y, z], |_, _| Ok(()));
    assert!(matches!(r, Err(Error::QueueFull { .. })), "{:?}", r.err());
}

#[test]
fn a_scoped_receive_reports_its_completion_once() {
    let (mut a, mut b) = common::pair::<8>(Duration::from_secs(10));
    let mut ask = *b"ping";
    let ask = a.pd.register(&mut ask).unwrap();
    let (mut r1, mut r2) = ([0u8; 8], [0u8; 8]);
    let mut r1 = a.pd.register(&mut r1).unwrap();
    let mut r2 = a.pd.register(&mut r2).unwrap();
    std::thread::scope(|t| {
        t.spawn(|| {
            let mut buf = [0u8; 8];
            let mut buf = b.pd.register(&mut buf).unwrap();
            b.ch.receive([buf.slice_mut(..).unwrap()]).unwrap();
            b.ch.send_with_imm([buf.slice(..3).unwrap()], 0xfeed)
                .unwrap();
            b.ch.send([buf.slice(..2).unwrap()]).unwrap();
        });
        let (first, second) =
            a.ch.scope(|s| {
                let one = s.post_receive([r1.slice_mut(..)?])?;
                let two = s.post_receive([r2.slice_mut(..)?])?;
                s.post_send([ask.slice(..)?])?;
                // Taken out of order: the second is waited for first.
                let second = s.wait_receive(two)?;
                let first = s.wait_receive(one)?;
                Ok((first, second))
            })
            .unwrap();
        assert_eq!((first.byte_len, first.imm), (3, Some(0xfeed)));
        assert_eq!((second.byte_len, second.imm), (2, None));
    });
    assert_eq!(a.ch.in_flight(), (0, 0));
    assert_eq!(&r1.as_slice()[..3], b"pin");
}

#[test]
fn a_receive_handle_of_another_scope_is_refused() {
    let (mut a, _b) = common::pair::<8>(Duration::from_millis(200));
    let mut buf = [0u8; 8];
    let mut buf = a.pd.register(&mut buf).unwrap();
    // The first scope ends on its receive (nobody sends: it times out, flushed).
    let mut escaped = None;
    let r = a.ch.scope(|s| {
        escaped = Some(s.post_receive([buf.slice_mut(..)?])?);
        Ok(())
    });
    assert!(r.is_err());
    let escaped = escaped.unwrap();
    let r = a.ch.scope(|s| s.wait_receive(escaped));
    assert!(matches!(r, Err(Error::InvalidAttribute(_))), "{r:?}");
}
