//! The async layer (`zverbs::tokio`, feature `tokio`) on every backend: each operation on
//! owned pool buffers, woken by the backend's completion events, and a receive whose future
//! was dropped keeping its buffer until the message lands.

use std::time::Instant;

use super::*;
use zverbs::tokio::AsyncChannel;
use zverbs::{ChannelConfig, LocalBuf, MrPool};

/// Two connected async channels on a current-thread runtime: sends (with and without
/// immediate data), write and read, fetch-and-add and compare-and-swap, and a dropped
/// receive whose buffer goes back to the pool only after a message landed in it.
pub fn async_operations<E: Env>(env: &E) -> Run<Outcome>
where
    E::P: 'static,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    let (da, db) = env.devices();
    let open = |dev: &str| -> Run<_> {
        let ctx = Context::open(env.provider(), dev).map_err(err("open"))?;
        let pd = ctx.alloc_pd().map_err(err("pd"))?;
        let cfg = ChannelConfig {
            qp: env.qp_config(&ctx),
            timeout: Some(env.timeout()),
            ..ChannelConfig::default()
        };
        let ch = AsyncChannel::<E::P>::prepare(&ctx, &pd, &cfg).map_err(err("prepare"))?;
        let pool = MrPool::new(&pd, 1 << 16).map_err(err("pool"))?;
        Ok((ctx, pd, ch, pool))
    };
    let (_ca, pa, a, pool_a) = open(da)?;
    let (_cb, pb, b, pool_b) = open(db)?;
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let a = a.connect(&eb).map_err(err("connect a"))?;
    let b = b.connect(&ea).map_err(err("connect b"))?;
    let target = region(
        &pb,
        16,
        AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
        0,
    )?;
    let remote = target.remote();
    let timeout = env.timeout();
    let mut o = Outcome::default();
    rt.block_on(async {
        let _in = tokio::runtime::Handle::current();
        let a = AsyncChannel::new(a).map_err(err("async a"))?;
        let b = AsyncChannel::new(b).map_err(err("async b"))?;
        let filled = |pool: &MrPool<E::P>, bytes: &[u8]| -> Run<LocalBuf<E::P>> {
            let mut buf = pool.alloc(bytes.len()).map_err(|e| e.to_string())?;
            buf.copy_from_slice(bytes);
            Ok(buf)
        };
        let inbox = pool_b.alloc(16).map_err(|e| e.to_string())?;
        let ((got, inbox), (sent, _)) =
            tokio::join!(b.receive(inbox), a.send(filled(&pool_a, b"hello")?));
        sent.map_err(err("send"))?;
        o.item("receive", got.map_err(err("receive"))?.byte_len);
        o.check("bytes", &inbox[..5] == b"hello");
        let ((got, _), (sent, _)) = tokio::join!(
            b.receive(inbox),
            a.send_with_imm(filled(&pool_a, b"imm")?, 7)
        );
        sent.map_err(err("send imm"))?;
        o.item("imm", got.map_err(err("receive imm"))?.imm.unwrap_or(0));
        let (w, _) = a.write(filled(&pool_a, b"written")?, &remote).await;
        w.map_err(err("write"))?;
        let (r, back) = a
            .read(pool_a.alloc(7).map_err(|e| e.to_string())?, &remote)
            .await;
        r.map_err(err("read"))?;
        o.check("write_read", &back[..] == b"written");
        let counter = remote.slice(8..16).map_err(err("slice"))?;
        let word = pool_a.alloc(8).map_err(|e| e.to_string())?;
        let (old, word) = a.fetch_add(word, &counter, 5).await;
        let (old2, word) = a.fetch_add(word, &counter, 1).await;
        o.item(
            "fetch_add",
            format!(
                "{},{}",
                old.map_err(err("fadd"))?,
                old2.map_err(err("fadd"))?
            ),
        );
        let (cas, _) = a.compare_swap(word, &counter, 6, 9).await;
        o.item("compare_swap", cas.map_err(err("cas"))?);
        // A receive posted, its future dropped: the buffer stays with the channel until
        // the next message lands in it.
        let before = pool_b.stats().allocations;
        {
            let fut = b.receive(pool_b.alloc(16).map_err(|e| e.to_string())?);
            let _ = tokio::time::timeout(std::time::Duration::from_millis(5), fut).await;
        }
        o.check("held", pool_b.stats().allocations == before + 1);
        a.send(filled(&pool_a, b"late")?)
            .await
            .0
            .map_err(err("late send"))?;
        let t0 = Instant::now();
        while pool_b.stats().allocations != before && t0.elapsed() < timeout {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        o.check("released", pool_b.stats().allocations == before);
        Ok::<(), String>(())
    })?;
    drop(pa);
    Ok(o)
}

#[allow(non_upper_case_globals)]
pub mod expected {
    pub const async_operations: &str = "receive=5; bytes=ok; imm=7; write_read=ok; fetch_add=0,5; compare_swap=6; held=ok; released=ok";
}
