//! MEMCACHE_SRV: the servers named by a DNS SRV record, as the Go service finds them: the name
//! must look like `_service._proto.name`; each record gives `target:port`, the target written
//! as DNS returns it (`memcached-0.memcached.default.svc.cluster.local.`), and the list is
//! sorted, because the key distribution follows the list's order.
//!
//! A small DNS client over UDP (TCP when the answer is truncated), asking the nameservers of
//! `/etc/resolv.conf` (or SLUICE_MEMCACHE_SRV_RESOLVER), with its `search` domains and `ndots`
//! applied as the system's resolver does. Every answer is bounded: at most
//! [`MAX_MESSAGE_BYTES`], each server asked within [`QUERY_TIMEOUT`].

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The largest DNS message read (the EDNS0 size Sluice advertises; over TCP, the same cap).
pub(crate) const MAX_MESSAGE_BYTES: usize = 4096;
/// How long each nameserver has to answer one query.
pub(crate) const QUERY_TIMEOUT: Duration = Duration::from_secs(2);
/// The resolver file read when no resolver is set.
pub(crate) const RESOLV_CONF: &str = "/etc/resolv.conf";
const MAX_RESOLV_CONF_BYTES: u64 = 64 * 1024;

const TYPE_SRV: u16 = 33;
const TYPE_OPT: u16 = 41;
const CLASS_IN: u16 = 1;

/// Splits `_service._proto.name` as the Go service does; `None` if it is not of that form.
pub(crate) fn parse_srv(name: &str) -> Option<(&str, &str, &str)> {
    let rest = name.strip_prefix('_')?;
    let (service, rest) = rest.split_once("._")?;
    let (proto, domain) = rest.split_once('.')?;
    (!service.is_empty() && !proto.is_empty() && !domain.is_empty())
        .then_some((service, proto, domain))
}

/// Where and how names are looked up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Resolver {
    pub nameservers: Vec<SocketAddr>,
    pub search: Vec<String>,
    pub ndots: usize,
}

impl Resolver {
    /// SLUICE_MEMCACHE_SRV_RESOLVER's one server, with no search domains.
    pub(crate) fn at(server: SocketAddr) -> Self {
        Resolver {
            nameservers: vec![server],
            search: Vec::new(),
            ndots: 1,
        }
    }

    /// The system's: `nameserver`, `search` (or `domain`) and `options ndots:N` of
    /// `/etc/resolv.conf`, read now (so a changed file is used at the next refresh).
    pub(crate) fn system() -> Result<Self, String> {
        use std::io::Read;
        let mut text = String::new();
        std::fs::File::open(RESOLV_CONF)
            .and_then(|f| f.take(MAX_RESOLV_CONF_BYTES).read_to_string(&mut text))
            .map_err(|e| format!("cannot read {RESOLV_CONF}: {e}"))?;
        let r = Self::parse(&text);
        if r.nameservers.is_empty() {
            return Err(format!("{RESOLV_CONF} names no nameserver"));
        }
        Ok(r)
    }

    fn parse(text: &str) -> Self {
        let mut r = Resolver {
            nameservers: Vec::new(),
            search: Vec::new(),
            ndots: 1,
        };
        for line in text.lines() {
            let mut words = line.split_whitespace();
            match words.next() {
                Some("nameserver") => {
                    if let Some(ip) = words.next().and_then(|w| w.parse().ok()) {
                        r.nameservers.push(SocketAddr::new(ip, 53));
                    }
                }
                Some("search" | "domain") => {
                    r.search = words.map(|w| w.trim_end_matches('.').to_owned()).collect();
                }
                Some("options") => {
                    for o in words {
                        if let Some(n) = o.strip_prefix("ndots:").and_then(|n| n.parse().ok()) {
                            r.ndots = usize::min(n, 15);
                        }
                    }
                }
                _ => {}
            }
        }
        r
    }

    /// The names to try for `name`, in order: as given first when it has at least `ndots`
    /// dots (or ends with one), else after the search domains.
    fn candidates(&self, name: &str) -> Vec<String> {
        if let Some(absolute) = name.strip_suffix('.') {
            return vec![absolute.to_owned()];
        }
        let searched = self.search.iter().map(|d| format!("{name}.{d}"));
        if name.matches('.').count() >= self.ndots {
            std::iter::once(name.to_owned()).chain(searched).collect()
        } else {
            searched.chain(std::iter::once(name.to_owned())).collect()
        }
    }

    /// The servers `srv` names, as `target:port` strings, sorted.
    pub(crate) async fn servers(&self, srv: &str) -> Result<Vec<String>, String> {
        if parse_srv(srv).is_none() {
            return Err(format!("could not parse {srv} to SRV parts"));
        }
        let mut last = format!("no SRV records for {srv}");
        for name in self.candidates(srv) {
            match self.lookup(&name).await {
                Ok(records) if !records.is_empty() => {
                    let mut servers: Vec<String> = records
                        .into_iter()
                        .map(|(target, port)| format!("{target}.:{port}"))
                        .collect();
                    servers.sort();
                    return Ok(servers);
                }
                Ok(_) => {}
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// The SRV records of one name, from the first nameserver that answers.
    async fn lookup(&self, name: &str) -> Result<Vec<(String, u16)>, String> {
        // Unpredictable (a new RandomState has a random seed), so a forged answer must guess it.
        let id = {
            use std::hash::BuildHasher;
            let seed = foldhash::fast::RandomState::default();
            seed.hash_one(name) as u16
        };
        let query = encode_query(id, name)?;
        let mut last = String::from("no nameserver");
        for &server in &self.nameservers {
            let answer = tokio::time::timeout(QUERY_TIMEOUT, ask(server, &query))
                .await
                .unwrap_or_else(|_| Err(format!("no answer within {QUERY_TIMEOUT:?}")));
            match answer.and_then(|m| decode_srv(&m, id)) {
                Ok(records) => return Ok(records),
                Err(e) => last = format!("{server}: {e}"),
            }
        }
        Err(last)
    }
}

/// Sends `query` over UDP, and again over TCP if the answer was truncated.
async fn ask(server: SocketAddr, query: &[u8]) -> Result<Vec<u8>, String> {
    let bind: SocketAddr = if server.is_ipv4() {
        "0.0.0.0:0".parse().expect("an address")
    } else {
        "[::]:0".parse().expect("an address")
    };
    let socket = tokio::net::UdpSocket::bind(bind)
        .await
        .map_err(|e| e.to_string())?;
    socket.connect(server).await.map_err(|e| e.to_string())?;
    socket.send(query).await.map_err(|e| e.to_string())?;
    let mut buf = vec![0; MAX_MESSAGE_BYTES];
    let n = socket.recv(&mut buf).await.map_err(|e| e.to_string())?;
    buf.truncate(n);
    let truncated = buf.get(2).is_some_and(|flags| flags & 0x02 != 0);
    if !truncated {
        return Ok(buf);
    }
    let mut tcp = tokio::net::TcpStream::connect(server)
        .await
        .map_err(|e| e.to_string())?;
    let len = u16::try_from(query.len()).map_err(|e| e.to_string())?;
    tcp.write_all(&len.to_be_bytes())
        .await
        .map_err(|e| e.to_string())?;
    tcp.write_all(query).await.map_err(|e| e.to_string())?;
    let n = usize::from(tcp.read_u16().await.map_err(|e| e.to_string())?);
    if n > MAX_MESSAGE_BYTES {
        return Err(format!(
            "an answer of {n} bytes, more than {MAX_MESSAGE_BYTES}"
        ));
    }
    let mut buf = vec![0; n];
    tcp.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
    Ok(buf)
}

/// A recursive query for `name`'s SRV records, with an EDNS0 record for larger UDP answers.
fn encode_query(id: u16, name: &str) -> Result<Vec<u8>, String> {
    let mut m = Vec::with_capacity(64);
    m.extend_from_slice(&id.to_be_bytes());
    m.extend_from_slice(&[0x01, 0x00]); // recursion desired
    m.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 1]); // one question, one additional (OPT)
    for label in name.split('.').filter(|l| !l.is_empty()) {
        let len = u8::try_from(label.len())
            .ok()
            .filter(|l| *l <= 63)
            .ok_or_else(|| format!("{name}: a label longer than 63 bytes"))?;
        m.push(len);
        m.extend_from_slice(label.as_bytes());
    }
    m.push(0);
    if m.len() > 12 + 255 {
        return Err(format!("{name}: a name longer than 255 bytes"));
    }
    m.extend_from_slice(&TYPE_SRV.to_be_bytes());
    m.extend_from_slice(&CLASS_IN.to_be_bytes());
    // OPT: root name, type 41, UDP size, extended rcode and flags 0, no data.
    m.push(0);
    m.extend_from_slice(&TYPE_OPT.to_be_bytes());
    m.extend_from_slice(&(MAX_MESSAGE_BYTES as u16).to_be_bytes());
    m.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    Ok(m)
}

/// A bounds-checked reader over a DNS message.
struct Reader<'m> {
    m: &'m [u8],
    at: usize,
}

impl Reader<'_> {
    fn bytes(&mut self, n: usize) -> Result<&[u8], String> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.m.len());
        let end = end.ok_or("a truncated DNS message")?;
        let b = &self.m[self.at..end];
        self.at = end;
        Ok(b)
    }

    fn u16(&mut self) -> Result<u16, String> {
        let b = self.bytes(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    /// A name, following compression pointers (at most 64 of them, so a loop ends).
    fn name(&mut self) -> Result<String, String> {
        let mut labels: Vec<String> = Vec::new();
        let mut at = self.at;
        let mut jumped = false;
        for _ in 0..64 {
            let len = *self.m.get(at).ok_or("a truncated DNS name")?;
            match len {
                0 => {
                    if !jumped {
                        self.at = at + 1;
                    }
                    return Ok(labels.join("."));
                }
                l if l & 0xc0 == 0xc0 => {
                    let low = *self.m.get(at + 1).ok_or("a truncated DNS name")?;
                    if !jumped {
                        self.at = at + 2;
                    }
                    jumped = true;
                    at = (usize::from(l & 0x3f) << 8) | usize::from(low);
                }
                l if l & 0xc0 == 0 => {
                    let start = at + 1;
                    let label = self
                        .m
                        .get(start..start + usize::from(l))
                        .ok_or("a truncated DNS label")?;
                    labels.push(String::from_utf8_lossy(label).into_owned());
                    at = start + usize::from(l);
                }
                _ => return Err("an unknown DNS label type".into()),
            }
        }
        Err("a DNS name with too many compression pointers".into())
    }
}

/// The SRV records (`target`, port) of an answer to query `id`; an error for a failed lookup
/// other than "no such name" (which is no records).
pub fn decode_srv(m: &[u8], id: u16) -> Result<Vec<(String, u16)>, String> {
    let mut r = Reader { m, at: 0 };
    if r.u16()? != id {
        return Err("an answer to another query".into());
    }
    let flags = r.u16()?;
    match flags & 0x000f {
        0 => {}
        3 => return Ok(Vec::new()),
        rcode => return Err(format!("the nameserver answered rcode {rcode}")),
    }
    let (questions, answers) = (r.u16()?, r.u16()?);
    r.bytes(4)?;
    for _ in 0..questions {
        r.name()?;
        r.bytes(4)?;
    }
    let mut records = Vec::new();
    for _ in 0..answers {
        r.name()?;
        let (kind, _class) = (r.u16()?, r.u16()?);
        r.bytes(4)?;
        let len = usize::from(r.u16()?);
        let end = r.at + len;
        if kind == TYPE_SRV {
            r.bytes(4)?; // priority, weight
            let port = r.u16()?;
            let target = r.name()?;
            records.push((target, port));
        }
        if end > m.len() {
            return Err("a truncated DNS record".into());
        }
        r.at = end;
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn srv_names_split_as_the_go_service_splits_them() {
        assert_eq!(
            parse_srv("_memcache._tcp.memcached.default.svc"),
            Some(("memcache", "tcp", "memcached.default.svc"))
        );
        assert_eq!(parse_srv("memcache._tcp.x"), None);
        assert_eq!(parse_srv("_memcache.tcp.x"), None);
        assert_eq!(parse_srv("_memcache._tcp"), None);
    }

    #[test]
    fn resolv_conf_gives_nameservers_search_and_ndots() {
        let r = Resolver::parse(
            "# kubernetes\nnameserver 10.96.0.10\nnameserver fd00::a\n\
             search default.svc.cluster.local svc.cluster.local\noptions ndots:5 timeout:1\n",
        );
        assert_eq!(
            r.nameservers,
            vec![
                "10.96.0.10:53".parse().unwrap(),
                "[fd00::a]:53".parse().unwrap()
            ]
        );
        assert_eq!(r.ndots, 5);
        assert_eq!(
            r.candidates("_m._tcp.memcached"),
            vec![
                "_m._tcp.memcached.default.svc.cluster.local",
                "_m._tcp.memcached.svc.cluster.local",
                "_m._tcp.memcached",
            ]
        );
        assert_eq!(r.candidates("_m._tcp.a.b.c.d.e"), {
            let mut v = vec!["_m._tcp.a.b.c.d.e".to_owned()];
            v.push("_m._tcp.a.b.c.d.e.default.svc.cluster.local".into());
            v.push("_m._tcp.a.b.c.d.e.svc.cluster.local".into());
            v
        });
        assert_eq!(r.candidates("_m._tcp.x."), vec!["_m._tcp.x"]);
    }

    /// An answer as a nameserver writes it: the question, then SRV records whose targets are
    /// compressed against it.
    fn answer(id: u16, rcode: u8, records: &[(u16, &str)]) -> Vec<u8> {
        let mut m = encode_query(id, "_memcache._tcp.example.test").unwrap();
        m.truncate(m.len() - 11); // no OPT
        m[2] = 0x81;
        m[3] = 0x80 | rcode;
        m[7] = records.len() as u8;
        m[11] = 0;
        for (port, target) in records {
            m.extend_from_slice(&[0xc0, 12]); // the question's name
            m.extend_from_slice(&TYPE_SRV.to_be_bytes());
            m.extend_from_slice(&CLASS_IN.to_be_bytes());
            m.extend_from_slice(&[0, 0, 0, 30]);
            let mut rdata = vec![0, 10, 0, 5];
            rdata.extend_from_slice(&port.to_be_bytes());
            let (host, _) = target.split_once('.').unwrap();
            rdata.push(host.len() as u8);
            rdata.extend_from_slice(host.as_bytes());
            rdata.extend_from_slice(&[0xc0, 12 + 10 + 5]); // "example.test" in the question
            m.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
            m.extend_from_slice(&rdata);
        }
        m
    }

    #[test]
    fn srv_answers_are_decoded_with_compressed_names() {
        let m = answer(
            7,
            0,
            &[(11211, "mc-b.example.test"), (11212, "mc-a.example.test")],
        );
        assert_eq!(
            decode_srv(&m, 7).unwrap(),
            vec![
                ("mc-b.example.test".to_owned(), 11211),
                ("mc-a.example.test".to_owned(), 11212)
            ]
        );
        assert!(decode_srv(&m, 8).is_err(), "another query's answer");
        assert_eq!(
            decode_srv(&answer(7, 3, &[]), 7).unwrap(),
            vec![],
            "NXDOMAIN"
        );
        assert!(
            decode_srv(&answer(7, 2, &[]), 7)
                .unwrap_err()
                .contains("rcode 2")
        );
        // Cut anywhere, it is an error, never a panic.
        for n in 0..m.len() {
            let _ = decode_srv(&m[..n], 7);
        }
        // A pointer loop ends.
        let mut looped = answer(7, 0, &[(1, "a.example.test")]);
        let at = looped.len() - 2;
        looped[at + 1] = at as u8;
        looped[at] = 0xc0;
        assert!(decode_srv(&looped, 7).is_err());
    }

    #[tokio::test]
    async fn servers_are_sorted_target_port_strings() {
        let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let mut buf = [0; 512];
            let (_, from) = socket.recv_from(&mut buf).await.unwrap();
            let id = u16::from_be_bytes([buf[0], buf[1]]);
            let m = answer(id, 0, &[(2, "mc-b.example.test"), (1, "mc-a.example.test")]);
            socket.send_to(&m, from).await.unwrap();
        });
        let servers = Resolver::at(addr)
            .servers("_memcache._tcp.example.test")
            .await
            .unwrap();
        assert_eq!(
            servers,
            vec!["mc-a.example.test.:1", "mc-b.example.test.:2"]
        );
        server.await.unwrap();
        let e = Resolver::at(addr)
            .servers("memcache.example")
            .await
            .unwrap_err();
        assert!(e.contains("could not parse"), "{e}");
    }
}
