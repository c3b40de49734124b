/**
 * Certificates for the egress proxy: the waffle CA (made once per home, its
 * private key readable by the proxy alone) and the leaf certificates the
 * proxy presents for the hosts whose requests it injects a secret into.
 * ECDSA P-256 through WebCrypto; `@peculiar/x509` writes the X.509.
 *
 * @module
 */
import "reflect-metadata";
import * as x509 from "@peculiar/x509";

const ALGORITHM = { name: "ECDSA", namedCurve: "P-256", hash: "SHA-256" } as const;
const DAY_MS = 24 * 3600 * 1000;

/** A certificate and its private key, both PEM. */
export interface CertifiedKey {
  /** The certificate, PEM. */
  cert: string;
  /** The private key, PKCS#8 PEM. */
  key: string;
}

/** Options of {@linkcode mintCa}. */
export interface MintCaOptions {
  /** The subject's common name; default `waffle egress CA`. */
  commonName?: string;
  /** How long it is valid; default 10 years. */
  days?: number;
}

/**
 * Makes a self-signed CA that may sign server certificates only (path
 * length 0).
 *
 * @example
 * ```ts ignore
 * const ca = await mintCa({ commonName: "waffle egress CA (/var/lib/waffle)" });
 * ```
 *
 * @param options Its name and lifetime.
 * @returns The CA certificate and key.
 */
export async function mintCa(options: MintCaOptions = {}): Promise<CertifiedKey> {
  const keys = await crypto.subtle.generateKey(ALGORITHM, true, ["sign", "verify"]);
  const now = Date.now();
  const cert = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: serial(),
    name: [{ CN: [options.commonName ?? "waffle egress CA"] }],
    notBefore: new Date(now - DAY_MS),
    notAfter: new Date(now + (options.days ?? 3650) * DAY_MS),
    keys,
    signingAlgorithm: ALGORITHM,
    extensions: [
      new x509.BasicConstraintsExtension(true, 0, true),
      new x509.KeyUsagesExtension(
        x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign,
        true,
      ),
      await x509.SubjectKeyIdentifierExtension.create(keys.publicKey),
    ],
  });
  return { cert: cert.toString("pem"), key: await pemKey(keys.privateKey) };
}

/** Options of {@linkcode mintLeaf}. */
export interface MintLeafOptions {
  /** How long it is valid; default 7 days (a proxy mints anew when it restarts). */
  days?: number;
}

/**
 * Makes a server certificate for one host (a DNS name or an IP literal),
 * signed by a CA.
 *
 * @example
 * ```ts ignore
 * const leaf = await mintLeaf(ca, "api.github.com");
 * ```
 *
 * @param ca The signing CA.
 * @param host The name (or address) the certificate is for.
 * @param options Its lifetime.
 * @returns The certificate (leaf only) and its key.
 */
export async function mintLeaf(
  ca: CertifiedKey,
  host: string,
  options: MintLeafOptions = {},
): Promise<CertifiedKey> {
  const issuer = new x509.X509Certificate(ca.cert);
  const signingKey = await crypto.subtle.importKey(
    "pkcs8",
    x509.PemConverter.decodeFirst(ca.key),
    ALGORITHM,
    false,
    ["sign"],
  );
  const keys = await crypto.subtle.generateKey(ALGORITHM, true, ["sign", "verify"]);
  const now = Date.now();
  const isIp = /^[0-9.]+$/.test(host) || host.includes(":");
  const cert = await x509.X509CertificateGenerator.create({
    serialNumber: serial(),
    subject: [{ CN: [host] }],
    issuer: issuer.subject,
    notBefore: new Date(now - DAY_MS),
    notAfter: new Date(now + (options.days ?? 7) * DAY_MS),
    signingKey,
    publicKey: keys.publicKey,
    signingAlgorithm: ALGORITHM,
    extensions: [
      new x509.SubjectAlternativeNameExtension([{ type: isIp ? "ip" : "dns", value: host }]),
      new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth]),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature, true),
      new x509.BasicConstraintsExtension(false),
      await x509.AuthorityKeyIdentifierExtension.create(issuer),
    ],
  });
  return { cert: cert.toString("pem"), key: await pemKey(keys.privateKey) };
}

/**
 * The SHA-256 fingerprint of a PEM certificate, as `AB:CD:…`.
 *
 * @param pem The certificate.
 * @returns The fingerprint.
 */
export async function fingerprint(pem: string): Promise<string> {
  const der = x509.PemConverter.decodeFirst(pem);
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", der));
  return [...digest].map((b) => b.toString(16).padStart(2, "0").toUpperCase()).join(":");
}

async function pemKey(key: CryptoKey): Promise<string> {
  return x509.PemConverter.encode(await crypto.subtle.exportKey("pkcs8", key), "PRIVATE KEY");
}

// A positive 128-bit serial, unique in practice.
function serial(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  bytes[0] = bytes[0]! & 0x7f | 0x01;
  return [...bytes].map((b) => b.toString(16).padStart(2, "0")).join("");
}
