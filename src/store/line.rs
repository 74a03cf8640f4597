//! What `crate::line` reads to answer waiting users' polls without Redis: the line's counter,
//! length and first number, and the room's epoch. No script: one MULTI/EXEC reads them
//! together, and the epoch is a single `SET NX`.

use super::{Room, StoreError};

/// One consistent reading of the line, for `crate::line`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineReading {
    /// The arrival counter: the last number handed out.
    pub last: u64,
    /// Users waiting.
    pub len: u64,
    /// The first waiting user's number.
    pub first: Option<u64>,
    pub epoch: Option<String>,
}

impl Room {
    /// The line's counter, length, first number and epoch, in one MULTI/EXEC.
    pub async fn read_line(&self) -> Result<LineReading, StoreError> {
        self.bounded(async {
            let mut conn = self.conn().await?;
            type Reply = (Option<u64>, u64, Vec<(String, f64)>, Option<String>);
            let (last, len, first, epoch): Reply = redis::pipe()
                .atomic()
                .cmd("GET")
                .arg(&self.keys.seq)
                .cmd("ZCARD")
                .arg(&self.keys.queue)
                .cmd("ZRANGE")
                .arg(&self.keys.queue)
                .arg(0)
                .arg(0)
                .arg("WITHSCORES")
                .cmd("GET")
                .arg(&self.keys.epoch)
                .query_async(&mut conn)
                .await?;
            Ok(LineReading {
                last: last.unwrap_or(0),
                len,
                first: first.first().map(|(_, score)| *score as u64),
                epoch,
            })
        })
        .await
    }

    /// Gives the room an epoch if it has none (a new room, or one reset since).
    pub async fn start_epoch(&self) -> Result<(), StoreError> {
        self.bounded(async {
            let mut conn = self.conn().await?;
            let _: Option<String> = redis::cmd("SET")
                .arg(&self.keys.epoch)
                .arg(uuid::Uuid::new_v4().simple().to_string())
                .arg("NX")
                .query_async(&mut conn)
                .await?;
            Ok(())
        })
        .await
    }
}
