//! What `crate::room::line` reads to answer waiting users' polls without Redis: the line's counter,
//! length and first number, the room's epoch and which server answered. No script: one
//! MULTI/EXEC reads them together, and the epoch is a single `SET NX`.
//!
//! The server is named by its `run_id`, which Redis draws afresh at every start and which a
//! replica promoted to primary does not share with the old primary. The epoch is a key, and
//! comes back with the data when Redis restarts from a snapshot or fails over to a replica that
//! lagged; the run_id does not, so numbers learned from one server are never read against
//! another's counter (`INFO server` costs Redis a few microseconds, 100 times a second).

use super::{RoomStore, StoreError};

/// One consistent reading of the line, for `crate::room::line`.
#[derive(Debug, Clone, PartialEq)]
pub struct LineReading {
    /// The arrival counter: the last number handed out.
    pub last: u64,
    /// Users waiting.
    pub len: u64,
    /// The first waiting user's number.
    pub first: Option<u64>,
    /// The first waiting user's score as Redis stores it (a scheduled event's drawn users sit
    /// below 1): what held polls are woken by (see `crate::hold`).
    pub front: Option<f64>,
    pub epoch: Option<String>,
    /// The answering server's `run_id` (empty if its INFO had none).
    pub server: String,
}

impl RoomStore {
    /// The line's counter, length, first number and epoch, in one MULTI/EXEC.
    pub async fn read_line(&self) -> Result<LineReading, StoreError> {
        self.bounded(async {
            let mut conn = self.conn().await?;
            type Reply = (Option<u64>, u64, Vec<(String, f64)>, Option<String>, String);
            let (last, len, first, epoch, info): Reply = redis::pipe()
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
                .cmd("INFO")
                .arg("server")
                .query_async(&mut conn)
                .await?;
            Ok(LineReading {
                last: last.unwrap_or(0),
                len,
                first: first.first().map(|(_, score)| *score as u64),
                front: first.first().map(|(_, score)| *score),
                epoch,
                server: run_id(&info).to_owned(),
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

/// The `run_id` field of an `INFO` answer.
fn run_id(info: &str) -> &str {
    info.lines()
        .find_map(|line| line.strip_prefix("run_id:"))
        .map_or("", str::trim)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_run_id_is_read_from_info() {
        let info = "# Server\r\nredis_version:7.0.15\r\nrun_id:4f0c1e\r\ntcp_port:6379\r\n";
        assert_eq!(super::run_id(info), "4f0c1e");
        assert_eq!(super::run_id("# Server\r\n"), "");
    }
}
