//! The HTTP side: axum routes behind the guard, the embedded assets, the live stream
//! (server-sent events: the current run's view whenever it changes).

use std::convert::Infallible;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::guard::{Guard, Seen};
use crate::runner::{Refused, Runner};
use crate::words::{self, Lang};
use crate::{Options, history, lessons, view};

const INDEX: &str = include_str!("../assets/index.html");
const SCRIPT: &str = include_str!("../assets/app.js");
const STYLE: &str = include_str!("../assets/app.css");

struct App {
    guard: Guard,
    runner: Arc<Runner>,
    backend: String,
    shutdown: tokio::sync::watch::Receiver<bool>,
}

type Shared = State<Arc<App>>;

/// The value of cookie `name` in a request's Cookie headers.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|kv| {
            let (k, v) = kv.trim().split_once('=')?;
            (k == name).then_some(v)
        })
}

/// The value of `name` in a query string.
fn query<'a>(q: Option<&'a str>, name: &str) -> Option<&'a str> {
    q?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == name).then_some(v)
    })
}

/// The page's language for a request: `?lang=`, its cookie, else Accept-Language.
fn lang_of(headers: &HeaderMap, q: Option<&str>) -> Lang {
    query(q, "lang")
        .and_then(Lang::parse)
        .or_else(|| cookie(headers, "iblab_lang").and_then(Lang::parse))
        .unwrap_or_else(|| {
            Lang::from_accept(
                headers
                    .get(header::ACCEPT_LANGUAGE)
                    .and_then(|v| v.to_str().ok()),
            )
        })
}

fn refuse(status: StatusCode, text: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{text}\n"),
    )
        .into_response()
}

/// Every request passes the guard; and every answer carries headers that keep it to this
/// page (no framing, no referrer with the token, nothing cached).
async fn guarded(State(app): Shared, req: Request, next: Next) -> Response {
    let h = req.headers();
    let s = |n: header::HeaderName| h.get(n).and_then(|v| v.to_str().ok());
    let cookie_name = app.guard.cookie();
    let q = req.uri().query();
    let mut tokens = vec![];
    tokens.extend(query(q, "token"));
    tokens.extend(h.get("x-iblab-token").and_then(|v| v.to_str().ok()));
    tokens.extend(cookie(h, &cookie_name));
    let seen = Seen {
        method_changes: !matches!(*req.method(), Method::GET | Method::HEAD),
        host: s(header::HOST),
        origin: s(header::ORIGIN),
        fetch_site: h.get("sec-fetch-site").and_then(|v| v.to_str().ok()),
        tokens,
    };
    if let Err(r) = app.guard.check(&seen) {
        tracing::warn!(method = %req.method(), uri = %req.uri().path(), "{r}");
        return refuse(StatusCode::FORBIDDEN, r.to_string());
    }
    // The token in the URL: into the cookie, and off the address bar.
    let from_url = query(q, "token").is_some() && req.uri().path() == "/";
    let lang = query(q, "lang").and_then(Lang::parse);
    let mut resp = if from_url {
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::SEE_OTHER;
        let to = match lang {
            Some(l) => format!("/?lang={}", l.tag()),
            None => "/".into(),
        };
        if let Ok(v) = HeaderValue::from_str(&to) {
            r.headers_mut().insert(header::LOCATION, v);
        }
        r
    } else {
        next.run(req).await
    };
    let hs = resp.headers_mut();
    if from_url
        && let Ok(v) = HeaderValue::from_str(&format!(
            "{cookie_name}={}; Path=/; HttpOnly; SameSite=Strict",
            app.guard.token()
        ))
    {
        hs.append(header::SET_COOKIE, v);
    }
    if let Some(l) = lang
        && let Ok(v) =
            HeaderValue::from_str(&format!("iblab_lang={}; Path=/; SameSite=Strict", l.tag()))
    {
        hs.append(header::SET_COOKIE, v);
    }
    hs.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
        ),
    );
    hs.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    hs.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    hs.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    hs.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    resp
}

async fn index(State(app): Shared, headers: HeaderMap, RawQuery(q): RawQuery) -> Response {
    let lang = lang_of(&headers, q.as_deref());
    let boot = json!({
        "words": words::catalog(lang),
        "backend": app.backend,
        "backends": crate::runner::BACKENDS,
    });
    let html = INDEX
        .replace("{{lang}}", lang.tag())
        .replace("{{title}}", &words::word(lang, "title"))
        .replace(
            "{{boot}}",
            &boot
                .to_string()
                .replace("</", "<\\/")
                .replace("<!--", "<\\!--"),
        );
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response()
}

async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        SCRIPT,
    )
        .into_response()
}

async fn style() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE).into_response()
}

fn json_response(v: Value) -> Response {
    axum::Json(v).into_response()
}

async fn all_lessons(headers: HeaderMap, RawQuery(q): RawQuery) -> Response {
    let lang = lang_of(&headers, q.as_deref());
    json_response(serde_json::to_value(lessons::all(lang)).unwrap_or_default())
}

async fn runs(State(app): Shared) -> Response {
    let list: Vec<Value> = history::list(app.runner.runs())
        .iter()
        .map(|(n, e)| history::entry(n, e))
        .collect();
    json_response(Value::Array(list))
}

async fn one_run(
    State(app): Shared,
    Path(name): Path<String>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> Response {
    let lang = lang_of(&headers, q.as_deref());
    let found = history::dir(app.runner.runs(), &name).and_then(|d| iblab_report::read(&d).ok());
    match found {
        Some(e) => json_response(view::of(&e, &name, lang, None)),
        None => refuse(
            StatusCode::NOT_FOUND,
            format!("no run `{name}` with evidence"),
        ),
    }
}

/// A file of a run folder: its report.html, evidence.json, a log.
async fn run_file(State(app): Shared, Path((name, rel)): Path<(String, String)>) -> Response {
    let Some(p) = history::file(app.runner.runs(), &name, &rel) else {
        return refuse(
            StatusCode::NOT_FOUND,
            format!("no file `{rel}` in run `{name}`"),
        );
    };
    let kind = match p.extension().and_then(|e| e.to_str()) {
        Some("html") => "text/html; charset=utf-8",
        Some("json") => "application/json",
        Some("xml") => "application/xml",
        _ => "text/plain; charset=utf-8",
    };
    match tokio::fs::read(&p).await {
        Ok(bytes) => ([(header::CONTENT_TYPE, kind)], bytes).into_response(),
        Err(e) => refuse(StatusCode::NOT_FOUND, format!("{e}")),
    }
}

/// A run from the page speaks the page's language (its report, its explanations).
async fn start(
    State(app): Shared,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
    axum::Json(r): axum::Json<crate::runner::Request>,
) -> Response {
    let lang = lang_of(&headers, q.as_deref());
    match app.runner.start(&r, lang) {
        Ok(name) => json_response(json!({ "started": name })),
        Err(Refused::Busy) => refuse(StatusCode::CONFLICT, words::word(lang, "busy")),
        Err(Refused::Bad(why)) => refuse(StatusCode::BAD_REQUEST, why),
        Err(Refused::Start(why)) => refuse(StatusCode::INTERNAL_SERVER_ERROR, why),
    }
}

async fn stop(State(app): Shared) -> Response {
    json_response(json!({ "stopping": app.runner.stop() }))
}

async fn current(State(app): Shared, headers: HeaderMap, RawQuery(q): RawQuery) -> Response {
    json_response(app.runner.view(lang_of(&headers, q.as_deref())))
}

/// The current run's view now, and again whenever it changes, until the server stops.
async fn live(State(app): Shared, headers: HeaderMap, RawQuery(q): RawQuery) -> Response {
    let lang = lang_of(&headers, q.as_deref());
    let rx = app.runner.subscribe();
    let stop = app.shutdown.clone();
    let first = true;
    let stream = futures_util::stream::unfold(
        (app, rx, stop, first),
        move |(app, mut rx, mut stop, first)| async move {
            if !first {
                tokio::select! {
                    r = rx.changed() => { if r.is_err() { return None; } }
                    _ = stop.wait_for(|s| *s) => { return None; }
                }
            }
            if *stop.borrow() {
                return None;
            }
            let v = app.runner.view(lang);
            let ev: Result<Event, Infallible> = Ok(Event::default().data(v.to_string()));
            Some((ev, (app, rx, stop, false)))
        },
    );
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

pub async fn serve(opts: Options) -> i32 {
    let listener = match tokio::net::TcpListener::bind(opts.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!(
                "error: cannot listen on {}: {e}\n  fix: pick another address or port, e.g. `iblab ui --listen 127.0.0.1:0` (any free port)",
                opts.listen
            );
            return iblab_core::exit::ENVIRONMENT;
        }
    };
    let addr = listener.local_addr().unwrap_or(opts.listen);
    let token = match crate::guard::new_token() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: cannot draw a token from /dev/urandom: {e}");
            return iblab_core::exit::ENVIRONMENT;
        }
    };
    if !addr.ip().is_loopback() {
        eprintln!(
            "warning: listening on {addr}, not only on this machine: whoever reaches this address and has the token can run labs here as root. Keep the token to yourself, or use the default (127.0.0.1) and an SSH tunnel."
        );
    }
    let runner = Runner::new(opts.iblab.clone(), opts.runs.clone(), opts.backend.clone());
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let app = Arc::new(App {
        guard: Guard::new(token.clone(), addr),
        runner: runner.clone(),
        backend: opts.backend.clone(),
        shutdown: shutdown_rx.clone(),
    });
    let router = Router::new()
        .route("/", get(index))
        .route("/app.js", get(script))
        .route("/app.css", get(style))
        .route("/api/lessons", get(all_lessons))
        .route("/api/runs", get(runs))
        .route("/api/runs/{name}", get(one_run))
        .route("/runs/{name}/{*file}", get(run_file))
        .route("/api/run", post(start))
        .route("/api/stop", post(stop))
        .route("/api/current", get(current))
        .route("/api/live", get(live))
        .layer(middleware::from_fn_with_state(app.clone(), guarded))
        .with_state(app);
    let host = if addr.ip().is_unspecified() {
        "127.0.0.1".to_string()
    } else if addr.is_ipv6() {
        format!("[{}]", addr.ip())
    } else {
        addr.ip().to_string()
    };
    println!(
        "iblab ui: the course's page is at\n  http://{host}:{}/?token={token}\nruns are read from and written to {}; Ctrl-C stops the page (a run it started is stopped and torn down first)",
        addr.port(),
        opts.runs.display()
    );
    let mut down = shutdown_rx.clone();
    let server = tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async move {
                let _ = down.wait_for(|s| *s).await;
            })
            .await
    });
    iblab_sys::interrupt::wait().await;
    if runner.busy() {
        eprintln!("interrupted: stopping the run and tearing its lab down first");
        runner.stop_and_wait().await;
    }
    let _ = shutdown_tx.send(true);
    match server.await {
        Ok(Ok(())) => iblab_core::exit::OK,
        Ok(Err(e)) => {
            eprintln!("error: the server failed: {e}");
            iblab_core::exit::ENVIRONMENT
        }
        Err(e) => {
            eprintln!("error: the server failed: {e}");
            iblab_core::exit::ENVIRONMENT
        }
    }
}
