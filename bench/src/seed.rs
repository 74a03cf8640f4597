//! RESP streams for `redis-cli --pipe`: a line of waiting users, and minted entry tokens.
//!
//! The layout is the one `lua/enter.lua` and `lua/admit.lua` use, with the proxy's key names
//! (`src/store/keys.rs`): the queue is a sorted set, member = user, score = the arrival number
//! taken from the counter `seq`; a token is a UUID under the user's token key, with a PX ttl, and
//! is also listed in `tokens` with its expiry in ms as the score.

use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::Args;
use waitroom_tools::numbers::SplitMix64;

use crate::keys::{Keys, DEFAULT_ROOM};
use crate::resp::encode;
use crate::{ctx, Result};

#[derive(Args)]
pub struct SeedArgs {
    /// The room's `redis.key_prefix` (keys are `{prefix}:...`).
    #[arg(long)]
    prefix: String,
    /// The room's name under `rooms` (keys are then `{prefix:NAME}:...`).
    #[arg(long, default_value = DEFAULT_ROOM)]
    room: String,
    /// Users to add.
    #[arg(long)]
    count: u64,
    /// Arrival numbers start after this one (the users are `<user-prefix><number>`).
    #[arg(long, default_value_t = 0)]
    from: u64,
    #[arg(long, default_value = "u")]
    user_prefix: String,
    /// Members per ZADD.
    #[arg(long, default_value_t = 1000)]
    batch: u64,
}

pub fn seed_queue(a: SeedArgs) -> Result<()> {
    let Keys { queue, seq, .. } = Keys::of_room(&a.prefix, &a.room);
    let stdout = std::io::stdout();
    let mut w = std::io::BufWriter::with_capacity(1 << 20, stdout.lock());
    let mut buf = Vec::with_capacity(1 << 16);
    let mut next = a.from + 1;
    let end = a.from + a.count;
    while next <= end {
        let last = (next + a.batch.max(1) - 1).min(end);
        let owned: Vec<(String, String)> =
            (next..=last).map(|n| (n.to_string(), format!("{}{n}", a.user_prefix))).collect();
        let mut args: Vec<&[u8]> = vec![b"ZADD", queue.as_bytes()];
        for (score, member) in &owned {
            args.push(score.as_bytes());
            args.push(member.as_bytes());
        }
        buf.clear();
        encode(&mut buf, &args);
        w.write_all(&buf).map_err(ctx("stdout"))?;
        next = last + 1;
    }
    // The counter enter.lua numbers new places from: later enters queue behind the seeded line.
    buf.clear();
    let end_s = end.to_string();
    encode(&mut buf, &[b"SET", seq.as_bytes(), end_s.as_bytes()]);
    w.write_all(&buf).map_err(ctx("stdout"))?;
    w.flush().map_err(ctx("stdout"))
}

#[derive(Args)]
pub struct MintArgs {
    #[arg(long)]
    prefix: String,
    #[arg(long, default_value = DEFAULT_ROOM)]
    room: String,
    /// Tokens to mint, one per user `t<tag>-<n>`.
    #[arg(long)]
    count: u64,
    /// Makes the users of this batch distinct from earlier batches.
    #[arg(long)]
    tag: String,
    #[arg(long, default_value_t = 600_000)]
    ttl_ms: u64,
    /// Where to write the `user token` pairs, one a line.
    #[arg(long)]
    pairs: std::path::PathBuf,
}

pub fn mint_tokens(a: MintArgs) -> Result<()> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_err(ctx("clock"))?;
    let mut rng = SplitMix64::new(now.as_nanos() as u64 ^ 0xA5A5_5A5A);
    let keys = Keys::of_room(&a.prefix, &a.room);
    let expires = (now.as_millis() as u64 + a.ttl_ms).to_string();
    let ttl = a.ttl_ms.to_string();
    let stdout = std::io::stdout();
    let mut w = std::io::BufWriter::with_capacity(1 << 20, stdout.lock());
    let file = std::fs::File::create(&a.pairs).map_err(ctx("pairs file"))?;
    let mut pairs = std::io::BufWriter::new(file);
    let mut buf = Vec::with_capacity(1 << 16);
    let mut zadd: Vec<String> = Vec::new();
    for n in 0..a.count {
        let user = format!("t{}-{n}", a.tag);
        let token = uuid_v4(&mut rng);
        let key = keys.token(&user);
        buf.clear();
        encode(&mut buf, &[b"SET", key.as_bytes(), token.as_bytes(), b"PX", ttl.as_bytes()]);
        w.write_all(&buf).map_err(ctx("stdout"))?;
        writeln!(pairs, "{user} {token}").map_err(ctx("pairs file"))?;
        zadd.push(user);
        if zadd.len() == 1000 || n + 1 == a.count {
            let mut args: Vec<&[u8]> = vec![b"ZADD", keys.tokens.as_bytes()];
            for user in &zadd {
                args.push(expires.as_bytes());
                args.push(user.as_bytes());
            }
            buf.clear();
            encode(&mut buf, &args);
            w.write_all(&buf).map_err(ctx("stdout"))?;
            zadd.clear();
        }
    }
    pairs.flush().map_err(ctx("pairs file"))?;
    w.flush().map_err(ctx("stdout"))
}

/// A random version-4 UUID in its usual text form (the proxy only compares tokens as bytes).
fn uuid_v4(rng: &mut SplitMix64) -> String {
    let hi = rng.next_u64();
    let lo = rng.next_u64();
    let hi = (hi & 0xFFFF_FFFF_FFFF_0FFF) | 0x0000_0000_0000_4000;
    let lo = (lo & 0x3FFF_FFFF_FFFF_FFFF) | 0x8000_0000_0000_0000;
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xFFFF,
        hi & 0xFFFF,
        lo >> 48,
        lo & 0xFFFF_FFFF_FFFF
    )
}
