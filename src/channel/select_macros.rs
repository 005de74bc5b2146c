//! `select!` and `select_biased!`: the macros that parse a select's arms and hand them to the
//! engine in `select.rs` (`run_list`). Exported at the crate root.

/// `vt::select! { recv(rx) -> msg => handle(msg), send(tx, 1) -> res => res.unwrap(), default => idle() }`
///
/// Waits on several channel operations at once; exactly one completes.
///
/// Arms, in any order, separated by commas (optional after a block, allowed after the last):
/// - `recv(rx) -> res => body`: `res: Result<T, RecvError>`;
/// - `send(tx, msg) -> res => body`: `res: Result<(), SendError<T>>`;
/// - at most one `default => body` (run if no operation is ready now) or
///   `default(timeout) => body` (run if none became ready within `timeout`).
///
/// As crossbeam-channel's macro: channel operands may be any expression (temporaries
/// included), evaluated once, in order, on entry; a send arm's message is evaluated only if
/// that arm is chosen, at most once (if the room or the receiver it was chosen for is gone
/// before the message is sent, the arm keeps it and waits like any other, and the message is
/// dropped if another arm then completes). The message expression is evaluated in a closure:
/// `?` or `return` inside it do not reach the caller, and two messages that borrow one
/// variable mutably do not compile (crossbeam's macro allows both). Among the ready arms one
/// is chosen uniformly at random (the arms are tried in a fresh random order;
/// [`select_biased!`](crate::select_biased) tries them in order). A disconnected channel's
/// arm is ready (it completes with `Err`). Without `default` it parks until an
/// operation completes; with `default(timeout)` it returns by the timeout whatever the arms
/// refer to, both ends of one channel included. Up to 32 operation arms; for a set of channels
/// known only at run time, use [`Select`](crate::channel::Select).
///
/// ```
/// use virtual_threads as vt;
/// use std::time::Duration;
///
/// let (tx1, rx1) = vt::channel::unbounded::<i32>();
/// let (tx2, rx2) = vt::channel::bounded::<&str>(1);
/// tx1.send(1).unwrap();
/// vt::select! {
///     recv(rx1) -> msg => assert_eq!(msg, Ok(1)),
///     send(tx2, "hi") -> res => res.unwrap(),
///     default(Duration::from_secs(1)) => panic!("both arms were ready"),
/// }
/// ```
#[macro_export]
macro_rules! select {
    ($($tokens:tt)*) => {
        $crate::__vt_select!(@start false [$($tokens)*])
    };
}

/// `vt::select_biased! { recv(urgent) -> m => handle(m), recv(normal) -> m => handle(m) }`
///
/// [`select!`] that tries its arms in the order written: among the ready arms, the first one
/// completes. For priorities (a shutdown channel before work); it can starve the later arms.
///
/// ```
/// use virtual_threads as vt;
///
/// let (tx1, rx1) = vt::channel::unbounded::<i32>();
/// let (tx2, rx2) = vt::channel::unbounded::<i32>();
/// tx1.send(1).unwrap();
/// tx2.send(2).unwrap();
/// let got = vt::select_biased! {
///     recv(rx1) -> msg => msg.unwrap(),
///     recv(rx2) -> msg => msg.unwrap(),
/// };
/// assert_eq!(got, 1);
/// ```
#[macro_export]
macro_rules! select_biased {
    ($($tokens:tt)*) => {
        $crate::__vt_select!(@start true [$($tokens)*])
    };
}

/// Implementation detail of [`select!`] and [`select_biased!`].
#[doc(hidden)]
#[macro_export]
macro_rules! __vt_select {
    (@start $biased:tt $tokens:tt) => {
        $crate::__vt_select!(
            @parse $biased $tokens [] []
            [__vt_a0 __vt_a1 __vt_a2 __vt_a3 __vt_a4 __vt_a5 __vt_a6 __vt_a7 __vt_a8 __vt_a9
             __vt_a10 __vt_a11 __vt_a12 __vt_a13 __vt_a14 __vt_a15 __vt_a16 __vt_a17 __vt_a18
             __vt_a19 __vt_a20 __vt_a21 __vt_a22 __vt_a23 __vt_a24 __vt_a25 __vt_a26 __vt_a27
             __vt_a28 __vt_a29 __vt_a30 __vt_a31]
        )
    };

    // ---- parsing: biased [tokens left] [arms so far] [default] [free identifiers] ----
    (@parse $b:tt [recv($r:expr $(,)?) -> $p:pat => $body:block, $($rest:tt)*] $arms:tt $def:tt $ids:tt) => {
        $crate::__vt_select!(@parse $b [recv($r) -> $p => $body $($rest)*] $arms $def $ids)
    };
    (@parse $b:tt [recv($r:expr $(,)?) -> $p:pat => $body:block $($rest:tt)*] [$($arms:tt)*] $def:tt
        [$id:ident $($ids:ident)*]) => {
        $crate::__vt_select!(@parse $b [$($rest)*]
            [$($arms)* ($id recv [$r] [] $p => $body)] $def [$($ids)*])
    };
    (@parse $b:tt [recv($r:expr $(,)?) -> $p:pat => $body:expr $(, $($rest:tt)*)?] [$($arms:tt)*] $def:tt
        [$id:ident $($ids:ident)*]) => {
        $crate::__vt_select!(@parse $b [$($($rest)*)?]
            [$($arms)* ($id recv [$r] [] $p => { $body })] $def [$($ids)*])
    };
    (@parse $b:tt [send($s:expr, $m:expr $(,)?) -> $p:pat => $body:block, $($rest:tt)*] $arms:tt $def:tt $ids:tt) => {
        $crate::__vt_select!(@parse $b [send($s, $m) -> $p => $body $($rest)*] $arms $def $ids)
    };
    (@parse $b:tt [send($s:expr, $m:expr $(,)?) -> $p:pat => $body:block $($rest:tt)*] [$($arms:tt)*] $def:tt
        [$id:ident $($ids:ident)*]) => {
        $crate::__vt_select!(@parse $b [$($rest)*]
            [$($arms)* ($id send [$s] [$m] $p => $body)] $def [$($ids)*])
    };
    (@parse $b:tt [send($s:expr, $m:expr $(,)?) -> $p:pat => $body:expr $(, $($rest:tt)*)?] [$($arms:tt)*] $def:tt
        [$id:ident $($ids:ident)*]) => {
        $crate::__vt_select!(@parse $b [$($($rest)*)?]
            [$($arms)* ($id send [$s] [$m] $p => { $body })] $def [$($ids)*])
    };
    (@parse $b:tt [default $(())? => $body:block, $($rest:tt)*] $arms:tt [] $ids:tt) => {
        $crate::__vt_select!(@parse $b [default => $body $($rest)*] $arms [] $ids)
    };
    (@parse $b:tt [default $(())? => $body:block $($rest:tt)*] $arms:tt [] $ids:tt) => {
        $crate::__vt_select!(@parse $b [$($rest)*] $arms
            [($crate::channel::__select::Deadline::Now) $body] $ids)
    };
    (@parse $b:tt [default $(())? => $body:expr $(, $($rest:tt)*)?] $arms:tt [] $ids:tt) => {
        $crate::__vt_select!(@parse $b [$($($rest)*)?] $arms
            [($crate::channel::__select::Deadline::Now) { $body }] $ids)
    };
    (@parse $b:tt [default($t:expr $(,)?) => $body:block, $($rest:tt)*] $arms:tt [] $ids:tt) => {
        $crate::__vt_select!(@parse $b [default($t) => $body $($rest)*] $arms [] $ids)
    };
    (@parse $b:tt [default($t:expr $(,)?) => $body:block $($rest:tt)*] $arms:tt [] $ids:tt) => {
        $crate::__vt_select!(@parse $b [$($rest)*] $arms
            [($crate::channel::__select::Deadline::after($t)) $body] $ids)
    };
    (@parse $b:tt [default($t:expr $(,)?) => $body:expr $(, $($rest:tt)*)?] $arms:tt [] $ids:tt) => {
        $crate::__vt_select!(@parse $b [$($($rest)*)?] $arms
            [($crate::channel::__select::Deadline::after($t)) { $body }] $ids)
    };
    (@parse $b:tt [default $($rest:tt)*] $arms:tt [$($def:tt)+] $ids:tt) => {
        ::core::compile_error!("select! takes at most one `default` arm")
    };
    (@parse $b:tt [] $arms:tt $def:tt $ids:tt) => {
        $crate::__vt_select!(@emit $b $arms $def)
    };
    (@parse $b:tt [$($rest:tt)+] $arms:tt $def:tt []) => {
        ::core::compile_error!("select! takes at most 32 operation arms")
    };
    (@parse $b:tt [$($rest:tt)+] $arms:tt $def:tt $ids:tt) => {
        ::core::compile_error!(
            "expected `recv(rx) -> res => body`, `send(tx, msg) -> res => body`, \
             `default => body` or `default(timeout) => body`"
        )
    };

    // ---- code generation ----
    (@emit $b:tt [$(($id:ident $kind:ident [$chan:expr] [$($m:expr)?] $p:pat => $body:block))*] $def:tt) => {
        // The operands are a `match` scrutinee, evaluated in order, once: every temporary in
        // them lives to the end of the `match`, also one made inside a call's arguments
        // (`r.unwrap_or(&never())`), which `let x = &expr;` would drop at the `;` (E0716).
        match ($(&$chan,)*) {
            ($($id,)*) => {
                $( let mut $id = $crate::__vt_select!(@new $kind $id [$($m)?]); )*
                $crate::channel::__select::run(
                    &mut [$($id.arm()),*],
                    $crate::__vt_select!(@deadline $def),
                    $b,
                );
                $( let $id = $id.into_result(); )*
                $crate::__vt_select!(@dispatch [$(($id $p => $body))*] $def)
            }
        }
    };
    (@new recv $chan:ident []) => { $crate::channel::__select::RecvArm::new($chan) };
    (@new send $chan:ident [$m:expr]) => { $crate::channel::__select::SendArm::new($chan, || $m) };
    (@deadline []) => { $crate::channel::__select::Deadline::Never };
    (@deadline [($deadline:expr) $body:block]) => { $deadline };
    (@dispatch [($id:ident $p:pat => $body:block) $($rest:tt)*] $def:tt) => {
        if let ::core::option::Option::Some(__vt_res) = $id {
            let $p = __vt_res;
            $body
        } else {
            $crate::__vt_select!(@dispatch [$($rest)*] $def)
        }
    };
    (@dispatch [] []) => {
        ::core::unreachable!("select! without `default` always completes an operation")
    };
    (@dispatch [] [($deadline:expr) $body:block]) => { $body };
}
