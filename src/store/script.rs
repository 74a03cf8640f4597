//! A script's KEYS, ARGV and reply, named once in Rust and read by name in Lua.
//!
//! Redis hands a script its keys and arguments as two numbered arrays and takes back an array.
//! Counted by hand on both sides, the positions drift the day a key is added in the middle, and a
//! reply whose layout depends on its tag moves every index behind it. So each script module
//! declares its three lists once, with [`script!`], and everything else follows from them:
//!
//! - Rust fills the keys and the arguments as struct literals (a value left out does not compile)
//!   and pushes them in declaration order;
//! - the Lua source gets a generated prelude that binds the same names in the same order
//!   (`local queue, seq = unpack(KEYS, 1, 2)`), so the script reads `queue`, never `KEYS[1]`;
//!   what follows the named arguments (a variable tail: the poll tiers, the fresh tokens) starts
//!   at `ARGV[REST]`, and keys the call adds past the declared ones (a group's members) at
//!   `KEYS[KEYS_REST]`;
//! - the reply is declared as a struct (one layout) or as an enum of tags (a tag, then that
//!   tag's own fields), and decoded field by field in declaration order: no index is counted in
//!   Rust, a tag's fields never move when another tag's change, and a reply longer than
//!   declared is an error rather than ignored. The Lua writes the same order, which its header
//!   lists by name.
//!
//! What it costs, measured with callgrind on Redis 7 (an enter of a waiting user, about 76k
//! instructions in Redis before this layer, 78k now): the prelude binds every name with one
//! `unpack` per array, where a line per name cost twice as much (a read of the global `KEYS`
//! goes through Redis's protected environment, about 250 instructions); numbers stay text until
//! the script's path needs them, because `tonumber` costs about a thousand and eagerly
//! converting all of enter's arguments added a fifth to every call. Replies were tried as name,
//! value pairs too (the names decoded in Rust): robust, but 6 % more per enter for the names on
//! the wire, so the layouts stay positional, declared once. The prelude is generated once, when
//! the `Script` is first used (a `LazyLock`): a call is still one EVALSHA, reloaded on NOSCRIPT.
//!
//! Shared Lua helpers (`lua/poll_clock.lua`, `lua/admission.lua`) are placed between the prelude
//! and the script, so they may read the names too; each says which names it needs, and building
//! a script that lacks one fails at once rather than at the first call that reaches the helper.

use std::fmt::Write as _;

use redis::{FromRedisValue, Script, Value};

use super::StoreError;

/// A Lua file shared by several scripts, placed after the prelude.
pub(super) struct Helper {
    file: &'static str,
    source: &'static str,
    /// Names the helper reads from the prelude.
    needs: &'static [&'static str],
}

/// The poll clock (contract section 9): reads the script's `poll_factor` argument and the tiers
/// in the tail of ARGV.
pub(super) const POLL_CLOCK: Helper = Helper {
    file: "lua/poll_clock.lua",
    source: include_str!("../../lua/poll_clock.lua"),
    needs: &["poll_factor", "REST"],
};

/// The room's clock (contract section 5: outages never count against a waiting user). Placed
/// before [`POLL_CLOCK`], which reads what it learned of the last outage.
pub(super) const ROOM_CLOCK: Helper = Helper {
    file: "lua/room_clock.lua",
    source: include_str!("../../lua/room_clock.lua"),
    needs: &["room_clock"],
};

/// The admission switches' helpers: everything they need comes as parameters.
pub(super) const ADMISSION: Helper = Helper {
    file: "lua/admission.lua",
    source: include_str!("../../lua/admission.lua"),
    needs: &[],
};

/// The room's state and the minute of admissions (contract section 15): only parameters.
pub(super) const ROOM_STATE: Helper = Helper {
    file: "lua/room_state.lua",
    source: include_str!("../../lua/room_state.lua"),
    needs: &[],
};

/// How the prelude binds an argument (Redis hands every one over as text).
#[derive(Debug, Clone, Copy)]
pub(super) enum Bind {
    /// As the text (numbers too: `tonumber()` where the script's path needs the number).
    Text,
    /// `true` / `false`, sent as `1` / `0`.
    Flag,
}

/// A type a script's argument may have, and how Lua reads it back.
pub(super) trait Arg: redis::ToRedisArgs {
    const BIND: Bind = Bind::Text;
}

impl Arg for &str {}
impl Arg for u32 {}
impl Arg for u64 {}
impl Arg for f64 {}

impl Arg for bool {
    const BIND: Bind = Bind::Flag;
}

/// The end of a reply: a value past the declared fields means the script and its declaration
/// disagree.
pub(super) fn nothing_left(file: &str, mut rest: impl Iterator<Item = Value>) -> Result<(), StoreError> {
    match rest.next() {
        None => Ok(()),
        Some(extra) => Err(StoreError::Reply(format!("{file}: more than declared, from {extra:?}"))),
    }
}

/// One field of a reply, named for messages: a missing trailing field reads as nil, which only
/// an `Option` (or a `bool`: false) accepts.
pub(super) fn field<T: FromRedisValue>(
    file: &str,
    name: &str,
    value: Option<Value>,
) -> Result<T, StoreError> {
    T::from_redis_value(value.unwrap_or(Value::Nil))
        .map_err(|error| StoreError::Reply(format!("{file}, field {name}: {error}")))
}

/// A field that the reply's tag promises.
pub(super) fn needed<T>(file: &str, name: &str, value: Option<T>) -> Result<T, StoreError> {
    value.ok_or_else(|| StoreError::Reply(format!("{file}: no {name} in the reply")))
}

/// The script: prelude, helpers, then the file's own source.
pub(super) fn build(file: &str, keys: &[&str], args: &[(&str, Bind)], helpers: &[Helper], source: &str) -> Script {
    Script::new(&lua(file, keys, args, helpers, source))
}

fn lua(file: &str, keys: &[&str], args: &[(&str, Bind)], helpers: &[Helper], source: &str) -> String {
    let arg_names = args.iter().map(|(name, _)| *name);
    let names: Vec<&str> = ["REST", "KEYS_REST"].into_iter().chain(keys.iter().copied()).chain(arg_names).collect();
    for (i, name) in names.iter().enumerate() {
        assert!(!names[..i].contains(name), "{file}: `{name}` is declared twice");
    }
    let mut lua = String::from("-- Generated by src/store/script.rs: the names of KEYS and ARGV.\n");
    let arg_names: Vec<&str> = args.iter().map(|(name, _)| *name).collect();
    for (names, array) in [(keys, "KEYS"), (&arg_names[..], "ARGV")] {
        if !names.is_empty() {
            let _ = writeln!(lua, "local {} = unpack({array}, 1, {})", names.join(", "), names.len());
        }
    }
    for (arg, bind) in args {
        if let Bind::Flag = bind {
            let _ = writeln!(lua, "{arg} = {arg} == '1'");
        }
    }
    let _ = writeln!(lua, "local REST, KEYS_REST = {}, {}", args.len() + 1, keys.len() + 1);
    for helper in helpers {
        for need in helper.needs {
            assert!(names.contains(need), "{file}: {} needs `{need}`", helper.file);
        }
        lua.push_str(helper.source);
        lua.push('\n');
    }
    lua.push_str(source);
    lua
}

/// Declares one script: its source (after the named helpers); its KEYS: the room's, by their
/// name in [`Keys`](super::Keys), then those the call computes (a user's token, ...) as a struct;
/// the struct of its ARGV; unless it answers a single value, the struct of its reply. The order
/// of the names is the order on the wire. Generates the `Script` (`$script`), the structs, and
/// `invoke`, which pushes a call's keys and arguments (push a variable tail after it, then run it
/// with [`RoomStore::run`](super::RoomStore) and decode with `Reply::decode`).
macro_rules! script {
    (
        static $script:ident = [$($helper:ident),*] $file:literal;
        keys [$($room_key:ident),* $(,)?] $(and $keys:ident { $($key:ident),+ $(,)? })?
        args $args:ident $(<$lt:lifetime>)? { $($arg:ident: $arg_ty:ty),+ $(,)? }
        $(reply $($reply:tt)+)?
    ) => {
        /// Where the script's own source is, for messages.
        const FILE: &str = $file;

        pub(in crate::store) static $script: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
            $crate::store::script::build(
                FILE,
                &[$(stringify!($room_key),)* $($(stringify!($key)),+)?],
                $args::BINDS,
                &[$($crate::store::script::$helper),*],
                // Every script module sits in src/store/, as this file does.
                include_str!(concat!("../../", $file)),
            )
        });

        $(
            /// The script's KEYS that are not the room's but the call's, in their order on the
            /// wire (after the room's).
            struct $keys<'k> {
                $($key: &'k str),+
            }
        )?

        /// The script's named ARGV, in their order on the wire.
        struct $args $(<$lt>)? {
            $($arg: $arg_ty),+
        }

        impl $(<$lt>)? $args $(<$lt>)? {
            const BINDS: &'static [(&'static str, $crate::store::script::Bind)] =
                &[$((stringify!($arg), <$arg_ty as $crate::store::script::Arg>::BIND)),+];
        }

        $(script_reply! { $($reply)+ })?

        fn invoke $(<$lt>)? (
            room: &$crate::store::Keys,
            $(keys: $keys<'_>,)?
            args: $args $(<$lt>)?,
        ) -> redis::ScriptInvocation<'static> {
            let mut call = $script.prepare_invoke();
            // A script may use none of the room's keys.
            let _ = room;
            $(call.key(&room.$room_key);)*
            $($(call.key(keys.$key);)+)?
            $(call.arg(args.$arg);)+
            call
        }
    };
}

/// A script's reply, decoded in the order its fields are declared: a struct when every reply
/// has one layout (a missing trailing field reads as nil), or an enum when the first value is a
/// tag and each tag has its own layout. A value the declaration does not expect is an error.
macro_rules! script_reply {
    ($reply:ident { $($field:ident: $field_ty:ty),+ $(,)? }) => {
        /// The script's reply, field by field.
        struct $reply {
            $($field: $field_ty),+
        }

        impl $reply {
            fn decode(reply: Vec<redis::Value>) -> Result<$reply, $crate::store::StoreError> {
                let mut values = reply.into_iter();
                let decoded = $reply {
                    $($field: $crate::store::script::field(FILE, stringify!($field), values.next())?),+
                };
                $crate::store::script::nothing_left(FILE, values)?;
                Ok(decoded)
            }
        }
    };
    ($reply:ident { $($tag:literal => $variant:ident { $($field:ident: $field_ty:ty),* $(,)? }),+ $(,)? }) => {
        /// The script's reply: its tag, and that tag's fields.
        enum $reply {
            $($variant { $($field: $field_ty),* }),+
        }

        // A script reads its reply whole (`decode`) or as one of a group's (`take`).
        #[allow(dead_code)]
        impl $reply {
            fn decode(reply: Vec<redis::Value>) -> Result<$reply, $crate::store::StoreError> {
                let mut values = reply.into_iter();
                let decoded = $reply::take(&mut values)?;
                $crate::store::script::nothing_left(FILE, values)?;
                Ok(decoded)
            }

            /// One reply from a flat array of them (a group's, one after another): its tag and
            /// that tag's fields, leaving the rest.
            fn take(values: &mut impl Iterator<Item = redis::Value>) -> Result<$reply, $crate::store::StoreError> {
                let tag: String = $crate::store::script::field(FILE, "tag", values.next())?;
                Ok(match tag.as_str() {
                    $($tag => $reply::$variant {
                        $($field: $crate::store::script::field(FILE, stringify!($field), values.next())?),*
                    },)+
                    other => return Err($crate::store::StoreError::Reply(format!("{FILE}: unknown tag {other}"))),
                })
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEEDY: Helper = Helper { file: "needy.lua", source: "-- needy\n", needs: &["poll_factor"] };

    #[test]
    fn the_prelude_binds_each_name_where_rust_pushes_it() {
        let args = [("user", Bind::Text), ("capacity", Bind::Text), ("listens", Bind::Flag)];
        let lua = lua("t.lua", &["queue", "heard"], &args, &[], "return 1\n");
        let expected = "\
local queue, heard = unpack(KEYS, 1, 2)
local user, capacity, listens = unpack(ARGV, 1, 3)
listens = listens == '1'
local REST, KEYS_REST = 4, 3
return 1
";
        assert_eq!(lua.split_once('\n').unwrap().1, expected);
    }

    #[test]
    #[should_panic(expected = "declared twice")]
    fn a_name_declared_twice_is_refused() {
        lua("t.lua", &["user"], &[("user", Bind::Text)], &[], "");
    }

    #[test]
    #[should_panic(expected = "needy.lua needs `poll_factor`")]
    fn a_helper_without_the_names_it_reads_is_refused() {
        lua("t.lua", &["queue"], &[], &[NEEDY], "");
    }

    #[test]
    fn a_reply_longer_than_declared_is_an_error() {
        assert!(nothing_left("t.lua", std::iter::empty()).is_ok());
        let error = nothing_left("t.lua", vec![Value::Int(1)].into_iter()).unwrap_err();
        assert!(error.to_string().contains("t.lua: more than declared"), "{error}");
    }

    #[test]
    fn a_missing_field_is_an_error_that_names_it() {
        let error = field::<i64>("t.lua", "position", None).unwrap_err();
        assert!(error.to_string().contains("t.lua, field position"), "{error}");
        assert_eq!(field::<Option<i64>>("t.lua", "position", None).unwrap(), None);
        assert!(!field::<bool>("t.lua", "already", Some(Value::Nil)).unwrap());
    }
}
