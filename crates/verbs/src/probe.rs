//! The lesson-3 verbs probe: the costs verbs impose, shown by making each mistake on real
//! queue pairs (two RC QPs on one device, connected to each other) and recording every
//! verbs call, the QP state walk and every completion status.

use std::ffi::c_void;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::ffi::{self, AhAttr, QpAttr, QpInitAttr, RecvWr, SendWr, Sge, Verbs, VerbsError, Wc};

/// One verbs call and what it returned.
#[derive(Debug, Clone, Serialize)]
pub struct Call {
    pub call: String,
    pub result: String,
}

/// One completion taken from the CQ.
#[derive(Debug, Clone, Serialize)]
pub struct Completion {
    pub wr_id: u64,
    pub qp_num: u32,
    pub status: u32,
    pub status_name: String,
    pub vendor_err: u32,
}

/// One mistake and its control (the same operation done right).
#[derive(Debug, Clone, Serialize)]
pub struct Scenario {
    pub claim: String,
    pub expected: String,
    pub observed: String,
    /// The control (done right) succeeded and the mistake failed as the lesson says.
    pub held: bool,
    /// The mistake's completion status, as verbs.h names it without `IBV_WC_`
    /// (`LOC_PROT_ERR`), `none` when it did not complete: the short word of a comparison
    /// row (`observed` says it whole).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub status: String,
    /// The states a post was refused in (`RESET`, `INIT`, `RTR`), where the mistake is a
    /// refused post.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub refused_in: Vec<String>,
    pub control: String,
    pub calls: Vec<Call>,
    pub completions: Vec<Completion>,
}

/// The whole report (`iblab verbs-probe` prints it as JSON).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub device: String,
    pub port: u8,
    pub gid_index: i32,
    pub gid: String,
    pub forgot_register_memory: Scenario,
    pub send_without_recv: Scenario,
    pub post_before_rts: Scenario,
    /// Not one of lesson 3's mistakes but what a shared device keeps apart: a key of a
    /// region another context (another process, another run's pod) registered does not
    /// let this context's queue pairs write there. Not counted in `all_held`.
    pub another_contexts_key: Scenario,
    /// The three mistakes behaved as the lesson says.
    pub all_held: bool,
}

const BUF: usize = 4096;

fn gid_text(g: &[u8; 16]) -> String {
    if g[..10].iter().all(|&b| b == 0) && g[10] == 0xff && g[11] == 0xff {
        format!("::ffff:{}.{}.{}.{}", g[12], g[13], g[14], g[15])
    } else {
        g.chunks(2)
            .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
            .collect::<Vec<_>>()
            .join(":")
    }
}

fn state_name(s: u32) -> &'static str {
    match s {
        ffi::QPS_RESET => "RESET",
        ffi::QPS_INIT => "INIT",
        ffi::QPS_RTR => "RTR",
        ffi::QPS_RTS => "RTS",
        4 => "SQD",
        5 => "SQE",
        ffi::QPS_ERR => "ERR",
        _ => "?",
    }
}

fn rc_text(rc: i32) -> String {
    if rc == 0 {
        "0 (ok)".into()
    } else {
        format!("{rc} ({})", std::io::Error::from_raw_os_error(rc.abs()))
    }
}

/// An open device with a PD and one CQ; everything is released on drop.
struct Dev<'a> {
    v: &'a Verbs,
    ctx: *mut c_void,
    pd: *mut c_void,
    cq: *mut c_void,
    port: u8,
    gid_index: i32,
    gid: [u8; 16],
    qps: Vec<*mut c_void>,
    mrs: Vec<*mut c_void>,
    calls: Vec<Call>,
}

impl Drop for Dev<'_> {
    fn drop(&mut self) {
        // SAFETY: every pointer was returned by libibverbs and is released once, in order.
        unsafe {
            for qp in self.qps.drain(..) {
                (self.v.destroy_qp)(qp);
            }
            for mr in self.mrs.drain(..) {
                (self.v.dereg_mr)(mr);
            }
            if !self.cq.is_null() {
                (self.v.destroy_cq)(self.cq);
            }
            if !self.pd.is_null() {
                (self.v.dealloc_pd)(self.pd);
            }
            if !self.ctx.is_null() {
                (self.v.close_device)(self.ctx);
            }
        }
    }
}

impl<'a> Dev<'a> {
    fn open(
        v: &'a Verbs,
        name: &str,
        port: u8,
        gid_index: Option<i32>,
    ) -> Result<Dev<'a>, VerbsError> {
        let mut n = 0;
        // SAFETY: plain libibverbs calls; the list is freed after the device is opened.
        let ctx = unsafe {
            let list = (v.get_device_list)(&mut n);
            if list.is_null() {
                return Err(VerbsError::NoDevices);
            }
            let mut found = std::ptr::null_mut();
            let mut names = Vec::new();
            for i in 0..n.max(0) as usize {
                let d = *list.add(i);
                let p = (v.get_device_name)(d);
                let dn = if p.is_null() {
                    String::new()
                } else {
                    std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
                };
                if dn == name {
                    found = d;
                }
                names.push(dn);
            }
            let ctx = if found.is_null() {
                std::ptr::null_mut()
            } else {
                (v.open_device)(found)
            };
            (v.free_device_list)(list);
            if found.is_null() {
                return Err(VerbsError::NoDevice {
                    name: name.to_string(),
                    devices: names,
                });
            }
            ctx
        };
        if ctx.is_null() {
            return Err(VerbsError::Open(name.to_string()));
        }
        let mut d = Dev {
            v,
            ctx,
            pd: std::ptr::null_mut(),
            cq: std::ptr::null_mut(),
            port,
            gid_index: 0,
            gid: [0; 16],
            qps: vec![],
            mrs: vec![],
            calls: vec![],
        };
        // SAFETY: ctx is open.
        d.pd = unsafe { (v.alloc_pd)(ctx) };
        if d.pd.is_null() {
            return Err(VerbsError::Null("ibv_alloc_pd"));
        }
        // SAFETY: ctx is open; no channel, vector 0.
        d.cq = unsafe { (v.create_cq)(ctx, 64, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
        if d.cq.is_null() {
            return Err(VerbsError::Null("ibv_create_cq"));
        }
        // The IPv4-mapped RoCEv2 GID, unless told which.
        let candidates: Vec<i32> = match gid_index {
            Some(i) => vec![i],
            None => (0..16).collect(),
        };
        for i in candidates {
            let mut g = [0u8; 16];
            // SAFETY: ctx is open; g is 16 bytes.
            if unsafe { (v.query_gid)(ctx, port, i, &mut g) } == 0
                && (gid_index.is_some() || (g[10] == 0xff && g[11] == 0xff))
            {
                d.gid_index = i;
                d.gid = g;
                return Ok(d);
            }
        }
        Err(VerbsError::NoMappedGid {
            name: name.to_string(),
            port,
        })
    }

    fn log(&mut self, call: String, result: String) {
        self.calls.push(Call { call, result });
    }

    fn reg(&mut self, buf: &mut [u8], access: i32) -> Result<(*mut c_void, u32, u32), VerbsError> {
        // SAFETY: buf outlives the MR (the caller keeps it until the Dev is dropped).
        let mr =
            unsafe { (self.v.reg_mr)(self.pd, buf.as_mut_ptr() as *mut c_void, buf.len(), access) };
        if mr.is_null() {
            self.log(format!("ibv_reg_mr(len {})", buf.len()), "NULL".into());
            return Err(VerbsError::RegMr);
        }
        self.mrs.push(mr);
        // SAFETY: mr is live.
        let (lkey, rkey) = unsafe { ffi::mr_keys(mr) };
        self.log(
            format!("ibv_reg_mr(addr {:p}, len {})", buf.as_ptr(), buf.len()),
            format!("lkey {lkey:#x} rkey {rkey:#x}"),
        );
        Ok((mr, lkey, rkey))
    }

    fn create_qp(&mut self, who: &str) -> Result<*mut c_void, VerbsError> {
        let mut init = QpInitAttr::rc(self.cq);
        // SAFETY: pd and cq are live; init is a valid ibv_qp_init_attr.
        let qp = unsafe { (self.v.create_qp)(self.pd, &mut init) };
        if qp.is_null() {
            return Err(VerbsError::Null("ibv_create_qp"));
        }
        self.qps.push(qp);
        // SAFETY: qp is live.
        let n = unsafe { ffi::qp_num(qp) };
        self.log(
            format!("ibv_create_qp(RC) {who}"),
            format!("qp {n:#x} in RESET"),
        );
        Ok(qp)
    }

    fn modify(&mut self, who: &str, qp: *mut c_void, attr: &mut QpAttr, mask: i32) -> i32 {
        // SAFETY: qp is live; attr is a valid ibv_qp_attr.
        let rc = unsafe { (self.v.modify_qp)(qp, attr, mask) };
        self.log(
            format!("ibv_modify_qp({who} → {})", state_name(attr.qp_state)),
            rc_text(rc),
        );
        rc
    }

    fn state(&self, qp: *mut c_void) -> u32 {
        let mut attr = QpAttr::default();
        let mut init = QpInitAttr::rc(std::ptr::null_mut());
        // SAFETY: qp is live.
        let rc = unsafe { (self.v.query_qp)(qp, &mut attr, ffi::QP_STATE, &mut init) };
        if rc == 0 { attr.qp_state } else { u32::MAX }
    }

    fn qp_init(&mut self, who: &str, qp: *mut c_void) -> i32 {
        let mut a = QpAttr {
            qp_state: ffi::QPS_INIT,
            pkey_index: 0,
            port_num: self.port,
            qp_access_flags: ffi::ACCESS_LOCAL_WRITE | ffi::ACCESS_REMOTE_WRITE,
            ..Default::default()
        };
        let mask = ffi::QP_STATE | ffi::QP_PKEY_INDEX | ffi::QP_PORT | ffi::QP_ACCESS_FLAGS;
        self.modify(who, qp, &mut a, mask)
    }

    /// INIT → RTR: where to send (the peer QP, through this port's own GID: loopback).
    fn qp_rtr(&mut self, who: &str, qp: *mut c_void, dest: u32) -> i32 {
        let mut ah = AhAttr {
            is_global: 1,
            port_num: self.port,
            ..Default::default()
        };
        ah.grh.dgid = self.gid;
        ah.grh.sgid_index = self.gid_index as u8;
        ah.grh.hop_limit = 1;
        let mut a = QpAttr {
            qp_state: ffi::QPS_RTR,
            path_mtu: 3, // IBV_MTU_1024: what rxe offers on a 1500-byte link
            dest_qp_num: dest,
            rq_psn: 0,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 1, // 0.01 ms: a receiver without a RECV answers RNR quickly
            ah_attr: ah,
            ..Default::default()
        };
        let mask = ffi::QP_STATE
            | ffi::QP_AV
            | ffi::QP_PATH_MTU
            | ffi::QP_DEST_QPN
            | ffi::QP_RQ_PSN
            | ffi::QP_MAX_DEST_RD_ATOMIC
            | ffi::QP_MIN_RNR_TIMER;
        self.modify(who, qp, &mut a, mask)
    }

    /// RTR → RTS: retries (`rnr_retry` 7 would mean "retry forever").
    fn qp_rts(&mut self, who: &str, qp: *mut c_void, rnr_retry: u8) -> i32 {
        let mut a = QpAttr {
            qp_state: ffi::QPS_RTS,
            timeout: 12,
            retry_cnt: 1,
            rnr_retry,
            sq_psn: 0,
            max_rd_atomic: 1,
            ..Default::default()
        };
        let mask = ffi::QP_STATE
            | ffi::QP_TIMEOUT
            | ffi::QP_RETRY_CNT
            | ffi::QP_RNR_RETRY
            | ffi::QP_SQ_PSN
            | ffi::QP_MAX_QP_RD_ATOMIC;
        self.modify(who, qp, &mut a, mask)
    }

    /// RESET → INIT → RTR → RTS, aimed at `dest` (a QP on this same device).
    /// Two RC QPs walked to RTS toward each other (one RNR retry).
    fn connected_pair(
        &mut self,
        first: &str,
        second: &str,
    ) -> Result<(*mut c_void, *mut c_void), VerbsError> {
        let a = self.create_qp(first)?;
        let b = self.create_qp(second)?;
        // SAFETY: live QPs.
        let (an, bn) = unsafe { (ffi::qp_num(a), ffi::qp_num(b)) };
        self.walk(first, a, bn, 1);
        self.walk(second, b, an, 1);
        Ok((a, b))
    }

    fn walk(&mut self, who: &str, qp: *mut c_void, dest: u32, rnr_retry: u8) -> i32 {
        let rc = self.qp_init(who, qp);
        if rc != 0 {
            return rc;
        }
        let rc = self.qp_rtr(who, qp, dest);
        if rc != 0 {
            return rc;
        }
        self.qp_rts(who, qp, rnr_retry)
    }

    fn post_send(&mut self, who: &str, qp: *mut c_void, wr: &mut SendWr) -> i32 {
        // SAFETY: ctx and qp are live; wr and its SGE live on the caller's stack.
        let rc = unsafe { ffi::post_send(self.ctx, qp, wr) };
        let what = if wr.opcode == ffi::WR_SEND {
            "SEND"
        } else {
            "RDMA_WRITE"
        };
        // SAFETY: sg_list points at the caller's SGE.
        let sge = unsafe { *wr.sg_list };
        self.log(
            format!(
                "ibv_post_send({who}, {what}, wr_id {}, addr {:#x}, lkey {:#x})",
                wr.wr_id, sge.addr, sge.lkey
            ),
            rc_text(rc),
        );
        rc
    }

    fn post_recv(&mut self, who: &str, qp: *mut c_void, wr: &mut RecvWr) -> i32 {
        // SAFETY: as above.
        let rc = unsafe { ffi::post_recv(self.ctx, qp, wr) };
        self.log(
            format!("ibv_post_recv({who}, wr_id {})", wr.wr_id),
            rc_text(rc),
        );
        rc
    }

    /// The completion of `wr_id`, polling until it comes or `wait` passes.
    fn completion(
        &mut self,
        wr_id: u64,
        wait: Duration,
        seen: &mut Vec<Completion>,
    ) -> Option<Completion> {
        let deadline = Instant::now() + wait;
        loop {
            let mut wc = Wc::default();
            // SAFETY: ctx and cq are live; wc is one ibv_wc.
            let n = unsafe { ffi::poll_cq(self.ctx, self.cq, &mut wc) };
            if n > 0 {
                let c = Completion {
                    wr_id: wc.wr_id,
                    qp_num: wc.qp_num,
                    status: wc.status,
                    status_name: self.v.status_name(wc.status),
                    vendor_err: wc.vendor_err,
                };
                self.log(
                    "ibv_poll_cq".into(),
                    format!("wr_id {} status {} ({})", c.wr_id, c.status, c.status_name),
                );
                seen.push(c.clone());
                if c.wr_id == wr_id {
                    return Some(c);
                }
                continue;
            }
            if n < 0 {
                self.log("ibv_poll_cq".into(), rc_text(n));
                return None;
            }
            if Instant::now() > deadline {
                self.log(
                    "ibv_poll_cq".into(),
                    format!("no completion for wr_id {wr_id} within {wait:?}"),
                );
                return None;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    fn take_calls(&mut self) -> Vec<Call> {
        std::mem::take(&mut self.calls)
    }
}

const WAIT: Duration = Duration::from_secs(5);

/// A completion status as verbs.h names it, without `IBV_WC_` (the numbers are the ABI's).
fn status_code(status: u32) -> &'static str {
    const NAMES: [&str; 22] = [
        "SUCCESS",
        "LOC_LEN_ERR",
        "LOC_QP_OP_ERR",
        "LOC_EEC_OP_ERR",
        "LOC_PROT_ERR",
        "WR_FLUSH_ERR",
        "MW_BIND_ERR",
        "BAD_RESP_ERR",
        "LOC_ACCESS_ERR",
        "REM_INV_REQ_ERR",
        "REM_ACCESS_ERR",
        "REM_OP_ERR",
        "RETRY_EXC_ERR",
        "RNR_RETRY_EXC_ERR",
        "LOC_RDD_VIOL_ERR",
        "REM_INV_RD_REQ_ERR",
        "REM_ABORT_ERR",
        "INV_EECN_ERR",
        "INV_EEC_STATE_ERR",
        "FATAL_ERR",
        "RESP_TIMEOUT_ERR",
        "GENERAL_ERR",
    ];
    NAMES.get(status as usize).copied().unwrap_or("?")
}

/// A completion's short status ([`status_code`]), `none` without one.
fn status_short(c: &Option<Completion>) -> String {
    c.as_ref()
        .map_or("none".into(), |c| status_code(c.status).to_string())
}

fn status_text(c: &Option<Completion>) -> String {
    match c {
        Some(c) => format!("IBV_WC status {} ({})", c.status, c.status_name),
        None => "no completion".into(),
    }
}

/// An RDMA WRITE of the first 64 bytes of `from` (its key `lkey`) from QP `qp` (named
/// `who`) to `remote_addr` with `rkey`, and its completion.
#[allow(clippy::too_many_arguments)]
fn write_64(
    d: &mut Dev<'_>,
    who: &str,
    qp: *mut c_void,
    from: &[u8],
    lkey: u32,
    remote_addr: u64,
    rkey: u32,
    wr_id: u64,
    seen: &mut Vec<Completion>,
) -> Option<Completion> {
    let mut sge = Sge::of(from, 64, lkey);
    let mut wr = SendWr::new(wr_id, ffi::WR_RDMA_WRITE, &mut sge);
    wr.remote_addr = remote_addr;
    wr.rkey = rkey;
    d.post_send(who, qp, &mut wr);
    d.completion(wr_id, WAIT, seen)
}

fn forgot_register_memory(d: &mut Dev<'_>) -> Result<Scenario, VerbsError> {
    let mut a_buf = vec![0x41u8; BUF];
    let mut b_buf = vec![0u8; BUF];
    let unregistered = vec![0x55u8; BUF];
    let (_, a_lkey, _) = d.reg(&mut a_buf, ffi::ACCESS_LOCAL_WRITE)?;
    let (_, _, b_rkey) = d.reg(
        &mut b_buf,
        ffi::ACCESS_LOCAL_WRITE | ffi::ACCESS_REMOTE_WRITE,
    )?;
    let (a, _) = d.connected_pair("A", "B")?;
    let mut seen = Vec::new();
    let to = b_buf.as_ptr() as u64;
    // Control: an RDMA WRITE from registered memory.
    let control = write_64(d, "A", a, &a_buf, a_lkey, to, b_rkey, 1, &mut seen);
    // The mistake: the same WRITE from a buffer that was never registered.
    let mistake = write_64(d, "A", a, &unregistered, a_lkey, to, b_rkey, 2, &mut seen);
    let after = d.state(a);
    d.log("ibv_query_qp(A)".into(), state_name(after).into());
    // rxe since Linux 7 (7.2 and 7.3 measured) completes the very request that failed its
    // local protection check as flushed, not with status 4, while the QP goes to ERR as
    // before: the request failed and took the QP down, which is what the claim is about.
    let flushed_by_its_own_error = mistake
        .as_ref()
        .is_some_and(|c| c.status == ffi::WC_WR_FLUSH_ERR)
        && after == ffi::QPS_ERR
        && seen
            .iter()
            .all(|c| c.wr_id == 2 || c.status == ffi::WC_SUCCESS);
    let held = control
        .as_ref()
        .is_some_and(|c| c.status == ffi::WC_SUCCESS)
        && (mistake
            .as_ref()
            .is_some_and(|c| c.status == ffi::WC_LOC_PROT_ERR)
            || flushed_by_its_own_error);
    let ok_written = b_buf[..64].iter().all(|&x| x == 0x41);
    Ok(Scenario {
        claim: "Memory must be registered: an RDMA WRITE from a buffer that was never registered fails with a local protection error and the QP goes to ERR.".into(),
        expected: "IBV_WC status 4 (local protection error), or (rxe on Linux ≥ 7) the request completed as flushed by the error it caused, with the QP in ERR".into(),
        observed: format!(
            "{}; QP A then in {}{}",
            status_text(&mistake),
            state_name(after),
            if flushed_by_its_own_error {
                " (the unregistered request itself completed as flushed, no other request failed: this provider flushes the request whose check failed)"
            } else {
                ""
            }
        ),
        held,
        status: status_short(&mistake),
        refused_in: vec![],
        control: format!("{}; the peer's buffer {} the data", status_text(&control), if ok_written { "holds" } else { "does not hold" }),
        calls: d.take_calls(),
        completions: seen,
    })
}

fn send_without_recv(d: &mut Dev<'_>) -> Result<Scenario, VerbsError> {
    let mut a_buf = vec![0x42u8; BUF];
    let mut b_buf = vec![0u8; BUF];
    let (_, a_lkey, _) = d.reg(&mut a_buf, ffi::ACCESS_LOCAL_WRITE)?;
    let (_, b_lkey, _) = d.reg(&mut b_buf, ffi::ACCESS_LOCAL_WRITE)?;
    // rnr_retry 1: one retry after a receiver-not-ready NAK, then give up.
    let (a, b) = d.connected_pair("A", "B")?;
    let mut seen = Vec::new();
    // Control: B posts a RECV first, then A SENDs.
    let mut rsge = Sge::of(&b_buf, BUF as u32, b_lkey);
    let mut rwr = RecvWr::new(10, &mut rsge);
    d.post_recv("B", b, &mut rwr);
    let mut sge = Sge::of(&a_buf, 64, a_lkey);
    let mut wr = SendWr::new(11, ffi::WR_SEND, &mut sge);
    d.post_send("A", a, &mut wr);
    let control = d.completion(11, WAIT, &mut seen);
    let _ = d.completion(10, Duration::from_millis(500), &mut seen);
    // The mistake: A SENDs again; B has no RECV posted.
    let mut sge = Sge::of(&a_buf, 64, a_lkey);
    let mut wr = SendWr::new(12, ffi::WR_SEND, &mut sge);
    d.post_send("A", a, &mut wr);
    let mistake = d.completion(12, WAIT, &mut seen);
    let after = d.state(a);
    d.log("ibv_query_qp(A)".into(), state_name(after).into());
    let held = control
        .as_ref()
        .is_some_and(|c| c.status == ffi::WC_SUCCESS)
        && mistake
            .as_ref()
            .is_some_and(|c| c.status == ffi::WC_RNR_RETRY_EXC_ERR);
    Ok(Scenario {
        claim: "A two-sided SEND needs a RECV posted first: without one the receiver answers receiver-not-ready until the sender's retries run out.".into(),
        expected: "IBV_WC status 13 (RNR retry counter exceeded)".into(),
        observed: format!("{}; QP A then in {}", status_text(&mistake), state_name(after)),
        held,
        status: status_short(&mistake),
        refused_in: vec![],
        control: format!("with a RECV posted: {}", status_text(&control)),
        calls: d.take_calls(),
        completions: seen,
    })
}

fn post_before_rts(d: &mut Dev<'_>) -> Result<Scenario, VerbsError> {
    let mut a_buf = vec![0x43u8; BUF];
    let mut b_buf = vec![0u8; BUF];
    let (_, a_lkey, _) = d.reg(&mut a_buf, ffi::ACCESS_LOCAL_WRITE)?;
    let (_, b_lkey, _) = d.reg(&mut b_buf, ffi::ACCESS_LOCAL_WRITE)?;
    let a = d.create_qp("A")?;
    let b = d.create_qp("B")?;
    // SAFETY: live QPs.
    let (an, bn) = unsafe { (ffi::qp_num(a), ffi::qp_num(b)) };
    d.walk("B", b, an, 1);
    let mut refused = Vec::new();
    // Post in RESET, INIT and RTR, walking one step further after each try.
    for step in 0..3 {
        let mut sge = Sge::of(&a_buf, 64, a_lkey);
        let mut wr = SendWr::new(30 + step, ffi::WR_SEND, &mut sge);
        let state = d.state(a);
        let rc = d.post_send(&format!("A in {}", state_name(state)), a, &mut wr);
        refused.push((state_name(state), rc));
        match step {
            0 => d.qp_init("A", a),
            1 => d.qp_rtr("A", a, bn),
            _ => d.qp_rts("A", a, 1),
        };
    }
    // Did a refused request still run once the QP reached RTS? rxe writes the WQE into
    // the queue it shares with the kernel before the doorbell is refused; the next
    // doorbell (a post in RTS) shows whether those WQEs were dropped or kept.
    let mut seen = Vec::new();
    let mut rsges: Vec<Sge> = (0..4)
        .map(|_| Sge::of(&b_buf, BUF as u32, b_lkey))
        .collect();
    for (k, sge) in rsges.iter_mut().enumerate() {
        let mut rwr = RecvWr::new(50 + k as u64, sge);
        d.post_recv("B", b, &mut rwr);
    }
    let mut sge = Sge::of(&a_buf, 64, a_lkey);
    let mut wr = SendWr::new(33, ffi::WR_SEND, &mut sge);
    d.post_send("A in RTS", a, &mut wr);
    let _ = d.completion(33, WAIT, &mut seen);
    let ghosts: Vec<&Completion> = seen
        .iter()
        .filter(|c| (30..33).contains(&c.wr_id))
        .collect();
    let note = if ghosts.is_empty() {
        String::new()
    } else {
        format!(
            "; yet {} refused request(s) ran at the next doorbell in RTS ({}): this provider left them in the send queue",
            ghosts.len(),
            ghosts
                .iter()
                .map(|c| format!("wr_id {} → {}", c.wr_id, c.status_name))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    // Control: a fresh pair walked to RTS first, with a RECV posted.
    let (c, e) = d.connected_pair("C", "D")?;
    let mut rsge = Sge::of(&b_buf, BUF as u32, b_lkey);
    let mut rwr = RecvWr::new(41, &mut rsge);
    d.post_recv("D", e, &mut rwr);
    let mut sge = Sge::of(&a_buf, 64, a_lkey);
    let mut wr = SendWr::new(40, ffi::WR_SEND, &mut sge);
    let rc = d.post_send("C in RTS", c, &mut wr);
    let control = if rc == 0 {
        d.completion(40, WAIT, &mut seen)
    } else {
        None
    };
    let held = refused.iter().all(|(_, rc)| *rc != 0)
        && control
            .as_ref()
            .is_some_and(|c| c.status == ffi::WC_SUCCESS);
    let observed = refused
        .iter()
        .map(|(s, rc)| format!("{s}: {}", rc_text(*rc)))
        .collect::<Vec<_>>()
        .join("; ");
    Ok(Scenario {
        claim: "A QP must be walked RESET → INIT → RTR → RTS before it can send: posting earlier is refused.".into(),
        expected: "ibv_post_send refused in RESET, INIT and RTR".into(),
        observed: format!("{observed}{note}"),
        held,
        status: String::new(),
        refused_in: refused
            .iter()
            .filter(|(_, rc)| *rc != 0)
            .map(|(s, _)| s.to_string())
            .collect(),
        control: format!(
            "a QP walked to RTS first: post {} then {}",
            rc_text(rc),
            status_text(&control)
        ),
        calls: d.take_calls(),
        completions: seen,
    })
}

/// A shared device keeps contexts apart: a second context on the same device (what
/// another process, or another run's pod given the same device, has) registers a region
/// for remote writes; this context's connected pair writes to its own peer's region (the
/// control), then to the other context's region with that region's own address and key:
/// the responder refuses the key, which belongs to another protection domain (remote
/// access error), and the region is untouched.
fn another_contexts_key(d: &mut Dev<'_>, other: &mut Dev<'_>) -> Result<Scenario, VerbsError> {
    let mut a_buf = vec![0x43u8; BUF];
    let mut b_buf = vec![0u8; BUF];
    let mut theirs = vec![0u8; BUF];
    let (_, a_lkey, _) = d.reg(&mut a_buf, ffi::ACCESS_LOCAL_WRITE)?;
    let (_, _, b_rkey) = d.reg(
        &mut b_buf,
        ffi::ACCESS_LOCAL_WRITE | ffi::ACCESS_REMOTE_WRITE,
    )?;
    let (_, _, their_rkey) = other.reg(
        &mut theirs,
        ffi::ACCESS_LOCAL_WRITE | ffi::ACCESS_REMOTE_WRITE,
    )?;
    let mut calls: Vec<Call> = other
        .take_calls()
        .into_iter()
        .map(|c| Call {
            call: format!("(the other context) {}", c.call),
            result: c.result,
        })
        .collect();
    let (a, _) = d.connected_pair("A", "B")?;
    let mut seen = Vec::new();
    let (ours, other_region) = (b_buf.as_ptr() as u64, theirs.as_ptr() as u64);
    let control = write_64(d, "A", a, &a_buf, a_lkey, ours, b_rkey, 1, &mut seen);
    let mistake = write_64(
        d,
        "A",
        a,
        &a_buf,
        a_lkey,
        other_region,
        their_rkey,
        2,
        &mut seen,
    );
    let untouched = theirs.iter().all(|&x| x == 0);
    let held = control
        .as_ref()
        .is_some_and(|c| c.status == ffi::WC_SUCCESS)
        && mistake
            .as_ref()
            .is_some_and(|c| c.status == ffi::WC_REM_ACCESS_ERR)
        && untouched;
    calls.extend(d.take_calls());
    Ok(Scenario {
        claim: "A shared device keeps contexts apart: a region another context registered cannot be written with its own key from this context's queue pairs.".into(),
        expected: "IBV_WC status 10 (remote access error), the other context's region untouched".into(),
        observed: format!(
            "{}; the other context's region {}",
            status_text(&mistake),
            if untouched { "untouched" } else { "WRITTEN" }
        ),
        held,
        status: status_short(&mistake),
        refused_in: vec![],
        control: status_text(&control),
        calls,
        completions: seen,
    })
}

/// Run the three mistakes on `device`, and the check of what it keeps apart.
pub fn run(device: &str, port: u8, gid_index: Option<i32>) -> Result<Report, VerbsError> {
    let v = Verbs::load()?;
    let mut d = Dev::open(&v, device, port, gid_index)?;
    let gid = gid_text(&d.gid);
    let (port, gid_index) = (d.port, d.gid_index);
    let f = forgot_register_memory(&mut d)?;
    let s = send_without_recv(&mut d)?;
    let p = post_before_rts(&mut d)?;
    let mut other = Dev::open(&v, device, port, Some(gid_index))?;
    let k = another_contexts_key(&mut d, &mut other)?;
    let all_held = f.held && s.held && p.held;
    Ok(Report {
        device: device.to_string(),
        port,
        gid_index,
        gid,
        forgot_register_memory: f,
        send_without_recv: s,
        post_before_rts: p,
        another_contexts_key: k,
        all_held,
    })
}

/// Entry point of the hidden `iblab verbs-probe` subcommand: the report as JSON on
/// stdout; exit 0 when every mistake behaved as the lesson says, 1 when one did not,
/// 3 when the probe could not run (no libibverbs, no device).
pub fn main(device: &str, port: u8, gid_index: Option<i32>) -> i32 {
    match run(device, port, gid_index) {
        Ok(r) => {
            println!("{}", serde_json::to_string(&r).unwrap_or_default());
            if r.all_held { 0 } else { 1 }
        }
        Err(e) => {
            eprintln!("verbs-probe: {e}");
            3
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gids_print_like_ibv_devinfo() {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&[198, 18, 0, 2]);
        assert_eq!(gid_text(&g), "::ffff:198.18.0.2");
        assert_eq!(state_name(ffi::QPS_ERR), "ERR");
        assert_eq!(rc_text(0), "0 (ok)");
        assert!(rc_text(22).starts_with("22 ("));
    }
}
